"""How ``tandem up`` / ``tandem demo`` react to SIGTERM, SIGHUP and SIGINT: the first raises ``Stop`` in the main
thread, so that the command stops its children in order (the gateway first, so that its in-flight requests
finish); a second one while stopping sets ``HURRY``, and the children still there are killed at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading

HURRY = threading.Event()           # a second signal while stopping: kill what is left at once
STOP_SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGTERM", "SIGHUP", "SIGINT")) if s)


class Stop(BaseException):
    """SIGTERM / SIGHUP / SIGINT reached ``up`` (raised in the main thread by the signal handler)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals():
    """While inside, SIGTERM / SIGHUP / SIGINT raise Stop in the main thread (once; later ones hurry the stop)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = []

    def handler(signum, frame):
        if raised:
            HURRY.set()
            return
        raised.append(signum)
        raise Stop(signum)

    HURRY.clear()
    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
