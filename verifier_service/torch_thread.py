"""The one OS thread that runs all of the verifier's torch work: loading, packing, warm-up, forwards and
the acceptance rule.

Why: torch's CPU ops parallelise with OpenMP (libgomp in the PyPI wheels), which keeps a team of worker
threads per *calling* thread. Once the process holds more OpenMP threads than the machine has CPUs,
libgomp stops spinning between parallel regions and sleeps instead ("throttled" spinning), and every
one of the ~250 regions of a forward then pays a futex wake-up. A gRPC server that runs forwards from
its handlers' pool threads (and loaded the model on the main thread) gets there at once. Measured on
2 cores, 2 torch threads, SmolLM2-135M, widths 1 / 5 / 9: 14.7 / 20.6 / 27.1 ms from one thread,
25-26 / 42-46 / 60-66 ms once forwards had also run on other threads (the same ops, interleaved);
through the verifier service a plain step took 26 ms against 19 ms in its own warm-up.

So every torch call of the verifier goes through ``run`` (from any thread: runs inline on the torch
thread, else submits there and waits), ``arun`` (from asyncio) or ``submit`` (queue it, do not wait: the
verifier's scheduler, ``verifier_service.scheduler``, queues its steps so). The thread is created on first use
and lives as long as the process; jobs run in the order queued.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading

_lock = threading.Lock()
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_ident: int | None = None


def _started() -> None:
    global _ident
    _ident = threading.get_ident()


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tandem-torch",
                                                              initializer=_started)
        return _executor


def on_torch_thread() -> bool:
    return _ident is not None and threading.get_ident() == _ident


def submit(fn, *args, **kwargs) -> concurrent.futures.Future:
    """Queues ``fn(*args, **kwargs)`` on the torch thread; returns its future at once."""
    return _pool().submit(fn, *args, **kwargs)


def run(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` on the torch thread; returns its result (or raises its exception)."""
    if on_torch_thread():
        return fn(*args, **kwargs)
    return _pool().submit(fn, *args, **kwargs).result()


async def arun(fn, *args, **kwargs):
    """``run`` for asyncio callers: awaits the torch thread without blocking the event loop."""
    if on_torch_thread():
        return fn(*args, **kwargs)
    return await asyncio.wrap_future(_pool().submit(functools.partial(fn, *args, **kwargs)))
