"""The children of ``tandem up``: each service as a process (``python -m tandem.cli serve-<name>``), waited for
until healthy, restarted when it dies, and stopped in order.

Supervision is like systemd's ``Restart=on-failure``: a child that dies (a signal, a non-zero exit code)
is started again on the same port, after 1 s, then 2, 4, ... up to 30 s between tries; the wait goes back
to 1 s once the child has stayed healthy for a minute. The gateway keeps serving meanwhile: without the
drafter it decodes with the target alone (and probes the drafter until it is back), without the verifier
it answers UNAVAILABLE until the verifier is back. A child that exits with code 0 was stopped on purpose
(SIGTERM to it) and is not restarted: without the drafter the gateway goes on target-only; without the
gateway or the verifier there is nothing to serve, so ``up`` stops. On Linux the children also get SIGTERM
from the kernel if ``up`` itself dies (PR_SET_PDEATHSIG).

While the children start, ``Cluster.wait_up`` says every few seconds who is still loading and in which
phase (the last ``[tandem] phase: ...`` line of its log), and records it in the run's ``starting.json``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tandem import spawn
from tandem.flags import DEFAULT_HOST
from tandem.up_logs import write_starting
from tandem.up_signals import HURRY

RESTART_FIRST_S = 1.0           # first wait before restarting a child that died (then doubling) ...
RESTART_MAX_S = 30.0            # ... up to this
RESTART_RESET_S = 60.0          # healthy this long after a restart: the next failure waits RESTART_FIRST_S again
PROGRESS_EVERY_S = 5.0          # "[tandem] loading ..." lines while the children start
_BIND_FAILURE = re.compile(r"(?:cannot listen on|Failed to bind to address) (\S+)")
PHASE = re.compile(r"\[tandem\] phase: (.+)")     # what a loading service prints as it enters each phase


class PortInUse(ValueError):
    """A port ``up`` needs is taken (found before starting anything, or by a child that could not bind)."""


class StartupFailed(RuntimeError):
    """A child exited, or did not become healthy in time, while ``up`` started the three."""


def note(message: str) -> None:
    print(f"[tandem] {message}", file=sys.stderr, flush=True)


# ---- health --------------------------------------------------------------------------------------
def wait_healthy(address: str, timeout: float = 60.0, *, deadline: float | None = None) -> None:
    """Polls the gRPC health service at ``address`` (plaintext: the children listen on loopback) until it says
    SERVING. Raises TimeoutError after ``timeout`` seconds, or at ``deadline`` (a time.monotonic()) when given."""
    from tandem.health import wait_serving
    from tandem.security import Security

    end = deadline if deadline is not None else time.monotonic() + timeout
    status, err = wait_serving(address, wait=max(0.0, end - time.monotonic()), timeout=2.0, security=Security(),
                               interval=0.1)
    if status != "SERVING":
        last = status or (f"{err.code().name}: {err.details()}" if hasattr(err, "code") else str(err))
        raise TimeoutError(f"{address} not healthy in time ({last})")


# ---- children ------------------------------------------------------------------------------------
@dataclass
class Child:
    """One service process and what it takes to start it again on the same port."""

    name: str
    args: list[str]                 # the serve-<name> flags but --port / --port-file
    port: int                       # --port: the requested one at first, the bound one once known
    label: str                      # e.g. "verifier (SmolLM2-135M-Instruct)"
    proc: subprocess.Popen | None = None
    started: float = 0.0            # time.monotonic() of the last start
    healthy_since: float | None = None
    restarts: int = 0
    backoff: float = RESTART_FIRST_S
    restart_at: float | None = None
    stopped: bool = False           # exited with code 0: not restarted


@dataclass
class Cluster:
    log_dir: Path
    children: dict[str, Child] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    stopping: bool = False
    gateway_port: int = 0           # the port the gateway will serve (recorded while the children start)

    @property
    def procs(self) -> dict[str, subprocess.Popen]:
        return {name: c.proc for name, c in self.children.items() if c.proc is not None}

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def _loading(self, name: str) -> str:
        """The child's label and the loading phase its log names last (``[tandem] phase: ...``)."""
        phase = None
        with contextlib.suppress(OSError):
            with open(self.log_path(name), "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 16384))
                for line in f.read().decode(errors="replace").splitlines():
                    m = PHASE.search(line)
                    phase = m.group(1).strip() if m else phase
        label = self.children[name].label
        return f"{label} ({phase})" if phase else label

    def _port_file(self, name: str) -> Path:
        return self.log_dir / f"{name}.port"

    def spawn(self, name: str, args: list[str], port: int = 0, label: str | None = None) -> None:
        """Starts serve-<name> (again, if it ran before) on ``port``; its output goes to <name>.log."""
        child = self.children.get(name)
        if child is None:
            child = self.children[name] = Child(name, list(args), port, label or name)
        port_file = self._port_file(name)
        port_file.unlink(missing_ok=True)
        with open(self.log_path(name), "a" if child.proc is not None else "w") as log:   # a restart appends
            if child.proc is not None:
                at = time.strftime("%Y-%m-%d %H:%M:%S")
                log.write(f"\n==== [tandem up] restart {child.restarts} of {name} at {at} "
                          f"(the last one exited with code {child.proc.returncode}) ====\n")
                log.flush()
            env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
            # Its own process group, so that a terminal's Ctrl-C reaches up alone and up stops the three in
            # order; SIGTERM from the kernel if up dies, even by SIGKILL (tandem.spawn: no preexec_fn)
            child.proc = spawn.popen([sys.executable, "-m", "tandem.cli", f"serve-{name}", *child.args,
                                      "--port", str(child.port), "--port-file", str(port_file)],
                                     die_with_parent=True, new_group=True,
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        child.started, child.healthy_since, child.restart_at = time.monotonic(), None, None
        (self.log_dir / f"{name}.pid").write_text(str(child.proc.pid))

    def _read_port(self, name: str) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            text = self._port_file(name).read_text().strip()
            return int(text) if text else None
        return None

    def tail(self, name: str, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path(name).read_text(errors="replace").splitlines()[-lines:])
        return ""

    def _exit_error(self, name: str) -> Exception:
        code = self.children[name].proc.returncode
        log = self.tail(name, 40)
        # tandem.serving's OSError, or grpc.aio's own RuntimeError("Failed to bind to address ...")
        bind = next((m for m in map(_BIND_FAILURE.search, reversed(log.splitlines())) if m), None)
        if bind is not None:
            hint = "; pick another with --gateway-port" if name == "gateway" else ""
            return PortInUse(f"the {name} cannot listen on {bind.group(1).rstrip(';.')} (port in use?){hint} "
                             f"(log: {self.log_path(name)})")
        return StartupFailed(f"{name} exited with code {code} while starting; its log ({self.log_path(name)}) "
                             f"ends with:\n{self.tail(name)}")

    def wait_up(self, names: list[str], deadline: float, progress_every: float = PROGRESS_EVERY_S) -> None:
        """Waits until each of ``names`` listens and is healthy, saying every few seconds who is still loading
        and how long each one took. Raises PortInUse / StartupFailed if one exits, TimeoutError at ``deadline``."""
        t0 = time.monotonic()
        pending = list(names)
        next_note = t0 + progress_every
        while pending:
            for name in list(pending):
                child = self.children[name]
                if child.proc.poll() is not None:
                    raise self._exit_error(name)
                port = self._read_port(name)
                if port is None:
                    continue
                try:
                    wait_healthy(f"{DEFAULT_HOST}:{port}", deadline=deadline)
                except TimeoutError as exc:
                    raise TimeoutError(f"{name}: {exc}; log:\n{self.tail(name)}") from None
                child.port = self.ports[name] = port
                child.healthy_since = time.monotonic()
                note(f"{child.label} ready in {child.healthy_since - child.started:.1f} s (port {port})")
                pending.remove(name)
            if not pending:
                return
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"{', '.join(pending)} not up within --startup-timeout; log of {pending[0]}:\n"
                                   f"{self.tail(pending[0])}")
            if now >= next_note:
                what = f"loading {', '.join(self._loading(n) for n in pending)} ... {now - t0:.0f} s"
                note(what)
                write_starting(self.log_dir, self.gateway_port, what)
                next_note += progress_every
            time.sleep(0.2)

    # ---- supervision -----------------------------------------------------------------------------
    def supervise(self, poll_s: float = 0.2) -> int:
        """Restarts children that fail, until one that cannot be done without stops cleanly (returns 0)
        or a signal raises Stop. Never returns otherwise."""
        while True:
            now = time.monotonic()
            for child in self.children.values():
                done = self._watch(child, now)
                if done is not None:
                    return done
            time.sleep(poll_s)

    def _watch(self, child: Child, now: float) -> int | None:
        if child.stopped:
            return None
        if child.restart_at is not None:
            if now >= child.restart_at:
                child.restarts += 1
                self.spawn(child.name, child.args)
            return None
        code = child.proc.poll()
        if code is None:
            if child.healthy_since is None:
                if self._read_port(child.name) is not None:
                    with contextlib.suppress(TimeoutError):
                        wait_healthy(f"{DEFAULT_HOST}:{child.port}", 1.0)
                        child.healthy_since = time.monotonic()
                        note(f"{child.name} is back (restart {child.restarts}, ready in "
                             f"{child.healthy_since - child.started:.1f} s, port {child.port})")
            elif child.backoff > RESTART_FIRST_S and now - child.healthy_since >= RESTART_RESET_S:
                child.backoff = RESTART_FIRST_S
            return None
        if code == 0:
            child.stopped = True
            if child.name == "drafter":
                note("drafter exited with code 0 (stopped on purpose); not restarting it: the gateway decodes with "
                     "the target alone")
                return None
            note(f"{child.name} exited with code 0 (stopped on purpose); stopping the rest")
            return 0
        last = self.tail(child.name, 1).strip() if code > 0 else ""
        note(f"{child.name} exited with code {code}; restarting in {child.backoff:g} s "
             f"(log: {self.log_path(child.name)})"
             + (f": {last}" if last else ""))
        child.restart_at = now + child.backoff
        child.backoff = min(child.backoff * 2, RESTART_MAX_S)
        return None

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM to all, the gateway first (its in-flight requests still need the drafter and the verifier),
        then SIGKILL to any still there after ``grace`` seconds, or at once on a second signal to ``up``."""
        self.stopping = True
        procs = {n: c.proc for n, c in self.children.items() if c.proc is not None}
        order = sorted(procs, key=lambda n: n != "gateway")
        end = time.monotonic() + grace

        def wait(proc: subprocess.Popen) -> None:
            while proc.poll() is None and time.monotonic() < end and not HURRY.is_set():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(0.1)

        for name in order:
            if procs[name].poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    procs[name].send_signal(signal.SIGTERM)
            if name == "gateway":
                wait(procs[name])
        for name in order:
            wait(procs[name])
            if procs[name].poll() is None:
                procs[name].kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    procs[name].wait(5)
