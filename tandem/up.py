"""``tandem up`` / ``tandem demo``: all three services as local processes on loopback.

``tandem up`` supervises them like systemd's ``Restart=on-failure``: a child that dies (a signal, a
non-zero exit code) is started again on the same port, after 1 s, then 2, 4, ... up to 30 s between
tries; the wait goes back to 1 s once the child has stayed healthy for a minute. The gateway keeps
serving meanwhile: without the drafter it decodes with the target alone (and probes the drafter until
it is back), without the verifier it answers UNAVAILABLE until the verifier is back. A child that exits
with code 0 was stopped on purpose (SIGTERM to it) and is not restarted: without the drafter the gateway
goes on target-only; without the gateway or the verifier there is nothing to serve, so ``up`` stops.

SIGTERM, SIGHUP and SIGINT to ``up`` stop all three (the gateway first, so that its in-flight requests
finish); on Linux the children also get SIGTERM from the kernel if ``up`` itself dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from gateway.cli import DEFAULT_DRAFT_CONFIDENCE, DEFAULT_HTTP_PORT
from tandem.affinity import check_cpus
from tandem.flags import DEFAULT_HOST, draft_length, flag

RESTART_FIRST_S = 1.0           # first wait before restarting a child that died (then doubling) ...
RESTART_MAX_S = 30.0            # ... up to this
RESTART_RESET_S = 60.0          # healthy this long after a restart: the next failure waits RESTART_FIRST_S again
PROGRESS_EVERY_S = 5.0          # "[tandem] loading ..." lines while the children start
LOG_PREFIX = "tandem-up-"       # default log folders: <tmp>/tandem-up-XXXX
KEEP_LOG_DIRS = 5               # old log folders kept (those of runs still going are never removed) ...
LOG_DIR_MAX_AGE_S = 24 * 3600   # ... and none older than this
_BIND_FAILURE = re.compile(r"(?:cannot listen on|Failed to bind to address) (\S+)")


def configure(p):
    flag(p, "target", "default", help="target model for the verifier ('default', .gguf or HF dir)")
    flag(p, "drafter", "default", help="drafter for the drafter service ('default' or a path)")
    flag(p, "gateway-port", 50051, int, help="gateway port (drafter and verifier take free ports)")
    flag(p, "draft-length", "auto", draft_length, help="draft length of every round: 'auto' (chosen each round "
         "from measured costs and acceptance; a plain step where speculation does not pay) or a fixed k")
    flag(p, "max-draft-length", 8, int, help="the longest block auto drafts")
    flag(p, "http-port", DEFAULT_HTTP_PORT, int, help="the gateway's OpenAI-compatible HTTP API and chat page "
         "(http://127.0.0.1:PORT/; -1: off)")
    flag(p, "draft-confidence", DEFAULT_DRAFT_CONFIDENCE, float, help="adaptive draft length: the drafter stops a "
         "block before a token it is less sure of than this (0 = always k)")
    flag(p, "unseeded-sampling", "coupled", help="a sampled request without a seed: 'coupled' (a secret seed: "
         "the drafter can only cost speed) or 'rejection' (trusts the drafter's q); the gateway's "
         "--unseeded-sampling", choices=("coupled", "rejection"))
    flag(p, "lookup-only", help="no drafter node: the gateway speculates only with blocks prompt lookup supplies, "
         "copied from the sequence itself (shows what the drafter node adds)", cast=bool)
    flag(p, "no-draft-ahead", help="the gateway asks the drafter for each block when the round needs it instead "
         "of having it draft the next block while the verifier checks this one", cast=bool)
    flag(p, "drafter-threads", 1, int, help="ONNX Runtime threads of the drafter")
    flag(p, "verifier-threads", 0, int, help="torch threads of the verifier (0: torch's default)")
    flag(p, "verifier-cpus", None, help="pin the verifier and the gateway to these CPUs, e.g. '0' (Linux; "
         "unset: all)")
    flag(p, "drafter-cpus", None, help="pin the drafter to these CPUs, e.g. '1': with --verifier-cpus, drafting "
         "never competes with verification for cores, as on two machines")
    flag(p, "startup-timeout", 900.0, float, help="seconds to wait for all three to be healthy")
    flag(p, "log-dir", None, help=f"write each service's log here (default: a new {LOG_PREFIX}* folder in the "
         f"temporary directory; the {KEEP_LOG_DIRS} latest of those are kept, none older than a day)")
    flag(p, "metrics-port", None, int, help="Prometheus metrics: gateway on this port, verifier on +1, drafter on "
         "+2 (unset: off)")
    flag(p, "allowed-origins", "", help="web origins whose pages may call the HTTP API from a browser (the "
         "gateway's --allowed-origins)")
    flag(p, "allowed-hosts", "", help="names the HTTP API answers to besides IP addresses, localhost and this "
         "machine's name (the gateway's --allowed-hosts)")


def configure_demo(p):
    configure(p)
    p.add_argument("prompt", nargs="?", default="Write a haiku about autumn.", help="the prompt to generate from")
    flag(p, "max-tokens", 64, int, help="new tokens to generate")


class PortInUse(ValueError):
    """A port ``up`` needs is taken (found before starting anything, or by a child that could not bind)."""


class StartupFailed(RuntimeError):
    """A child exited, or did not become healthy in time, while ``up`` started the three."""


class Stop(BaseException):
    """SIGTERM / SIGHUP / SIGINT reached ``up`` (raised in the main thread by the signal handler)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


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


# ---- ports ---------------------------------------------------------------------------------------
def port_in_use(port: int, host: str = DEFAULT_HOST) -> bool:
    """Whether a server could not listen on host:port now (bound as gRPC binds: SO_REUSEADDR, no SO_REUSEPORT)."""
    if not port:
        return False
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def check_ports(args) -> None:
    """Raises PortInUse for the first port of --gateway-port / --metrics-port (+1, +2) already taken."""
    port = getattr(args, "gateway_port", 0)
    if port_in_use(port):
        raise PortInUse(f"port {port} is in use (another `tandem up`?); pick another with --gateway-port")
    http = getattr(args, "http_port", -1)
    if http is not None and http > 0 and port_in_use(http):
        raise PortInUse(f"port {http} (the gateway's HTTP API) is in use; pick another with --http-port, or -1 "
                        "for none")
    base = getattr(args, "metrics_port", None)
    if base:
        for offset, name in enumerate(("gateway", "verifier", "drafter")):
            if port_in_use(base + offset):
                raise PortInUse(f"port {base + offset} (the {name}'s metrics, --metrics-port + {offset}) is in use; "
                                "pick another with --metrics-port")


# ---- log folders ---------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _in_use(folder: Path) -> bool:
    """A folder of a run still going: its ``up.pid`` or a child's ``<name>.pid`` names a live process."""
    for pid_file in folder.glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            if _alive(int(pid_file.read_text().strip())):
                return True
    return False


def _last_write(folder: Path) -> float:
    times = [folder.stat().st_mtime]
    for f in folder.iterdir():
        with contextlib.suppress(OSError):
            times.append(f.stat().st_mtime)
    return max(times)


STATE_FILE = "starting.json"    # in the log folder while the children load: what `tandem generate` reports
PHASE = re.compile(r"\[tandem\] phase: (.+)")     # what a loading service prints as it enters each phase


def write_starting(log_dir: Path, gateway_port: int, what: str) -> None:
    """Records that this run is still starting (``what``: who loads, in which phase, for how long)."""
    with contextlib.suppress(OSError):
        (log_dir / STATE_FILE).write_text(json.dumps({"gateway_port": gateway_port, "what": what, "pid": os.getpid()}))


def starting_run(gateway_port: int, root: str | Path | None = None) -> str | None:
    """What a `tandem up` of this user that serves ``gateway_port`` and is still starting is doing (None: none
    is): `tandem generate` says so instead of asking whether `tandem up` runs."""
    root = Path(root or tempfile.gettempdir())
    for folder in root.glob(LOG_PREFIX + "*"):
        with contextlib.suppress(OSError, ValueError):
            state = json.loads((folder / STATE_FILE).read_text())
            if state.get("gateway_port") == gateway_port and _alive(int(state["pid"])):
                return f"tandem up (pid {state['pid']}) is still starting: {state['what']}"
    return None


def clean_log_dirs(root: str | Path | None = None, keep: int = KEEP_LOG_DIRS, max_age_s: float = LOG_DIR_MAX_AGE_S,
                   now: float | None = None) -> list[Path]:
    """Removes this user's old ``tandem-up-*`` folders in ``root`` (the temporary directory): of those no run
    uses any more, all but the ``keep`` latest, and any older than ``max_age_s``. Returns what it removed."""
    root = Path(root or tempfile.gettempdir())
    now = time.time() if now is None else now
    idle = []
    for folder in root.glob(LOG_PREFIX + "*"):
        with contextlib.suppress(OSError):
            if folder.is_dir() and not folder.is_symlink() and folder.stat().st_uid == os.getuid() \
                    and not _in_use(folder):
                idle.append((_last_write(folder), folder))
    idle.sort(reverse=True)
    removed = []
    for rank, (written, folder) in enumerate(idle):
        if rank >= keep or now - written > max_age_s:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


# ---- children ------------------------------------------------------------------------------------
def _die_with_parent():
    """A preexec_fn (Linux, spawning from the main thread): the child gets SIGTERM when ``up`` dies, even by
    SIGKILL, and has its own process group, so that a terminal's Ctrl-C reaches ``up`` alone and ``up``
    stops the three in order. None elsewhere. (PR_SET_PDEATHSIG fires when the spawning *thread* ends,
    hence main thread only.)"""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        os.setpgid(0, 0)
        prctl(1, int(signal.SIGTERM), 0, 0, 0)      # PR_SET_PDEATHSIG
        if os.getppid() != parent:                   # up died before the line above took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


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
            child.proc = subprocess.Popen([sys.executable, "-m", "tandem.cli", f"serve-{name}", *child.args,
                                           "--port", str(child.port), "--port-file", str(port_file)],
                                          stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                          preexec_fn=_die_with_parent())
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
            while proc.poll() is None and time.monotonic() < end and not _HURRY.is_set():
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


# ---- signals -------------------------------------------------------------------------------------
_HURRY = threading.Event()          # a second signal while stopping: kill what is left at once
STOP_SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGTERM", "SIGHUP", "SIGINT")) if s)


@contextlib.contextmanager
def stop_on_signals():
    """While inside, SIGTERM / SIGHUP / SIGINT raise Stop in the main thread (once; later ones hurry the stop)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = []

    def handler(signum, frame):
        if raised:
            _HURRY.set()
            return
        raised.append(signum)
        raise Stop(signum)

    _HURRY.clear()
    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# ---- start ---------------------------------------------------------------------------------------
def _label(kind: str, spec: str | None) -> str:
    if spec in (None, "", "default"):
        if kind == "verifier":
            from tandem.models import DEFAULT_MODEL_NAME

            return f"verifier ({DEFAULT_MODEL_NAME})"
        with contextlib.suppress(ImportError, AttributeError, OSError):
            from tandem.defaults import SHIPPED_DRAFTER

            if (SHIPPED_DRAFTER / "model.onnx").exists():
                return f"drafter ({SHIPPED_DRAFTER.name})"
        return "drafter (default)"
    return f"{kind} ({Path(str(spec)).name or spec})"


def start_cluster(args) -> Cluster:
    """Starts verifier, drafter and gateway and waits until all three are healthy. Raises ValueError on bad
    CPU lists and PortInUse (a ValueError) on a port in use before starting any; PortInUse, StartupFailed or
    TimeoutError if one cannot start (the others are stopped then)."""
    v_cpus = getattr(args, "verifier_cpus", None)
    d_cpus = getattr(args, "drafter_cpus", None)
    for name, spec in (("verifier", v_cpus), ("drafter", d_cpus)):
        if spec:
            try:
                check_cpus(spec)
            except (ValueError, RuntimeError) as exc:
                raise ValueError(f"--{name}-cpus: {exc}") from None
    check_ports(args)
    if getattr(args, "http_port", -1) == 0:          # a free one, known here so it can be printed
        with socket.socket() as sock:
            sock.bind((DEFAULT_HOST, 0))
            args.http_port = sock.getsockname()[1]
    removed = []
    if args.log_dir:
        log_dir = Path(args.log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
    else:
        removed = clean_log_dirs()
        log_dir = Path(tempfile.mkdtemp(prefix=LOG_PREFIX))
    (log_dir / "up.pid").write_text(str(os.getpid()))
    cluster = Cluster(log_dir, gateway_port=args.gateway_port)
    write_starting(log_dir, args.gateway_port, "starting the services")
    deadline = time.monotonic() + args.startup_timeout
    note(f"logs: {log_dir}/{{verifier,drafter,gateway}}.log"
         + (f" (removed {len(removed)} old {LOG_PREFIX}* log folder{'s' * (len(removed) != 1)})" if removed else ""))
    note(f"starting {_label('verifier', args.target)}" + ("" if getattr(args, "lookup_only", False)
                                                          else f" and {_label('drafter', args.drafter)}"))
    base = getattr(args, "metrics_port", None)
    metrics = (lambda n: ["--metrics-port", str(base + n)]) if base else (lambda n: [])
    pin = (lambda cpus: ["--cpus", str(cpus)] if cpus else [])
    try:
        cluster.spawn("verifier", ["--target", args.target, "--threads", str(args.verifier_threads),
                                   *pin(v_cpus), *metrics(1)], label=_label("verifier", args.target))
        lookup_only = getattr(args, "lookup_only", False)
        if not lookup_only:
            cluster.spawn("drafter", ["--drafter", args.drafter, "--threads", str(args.drafter_threads),
                                      *pin(d_cpus), *metrics(2)], label=_label("drafter", args.drafter))
        cluster.wait_up(["verifier"] + ([] if lookup_only else ["drafter"]), deadline)
        verifier, drafter = cluster.ports["verifier"], cluster.ports.get("drafter")
        cluster.spawn("gateway", ["--verifier", f"{DEFAULT_HOST}:{verifier}",
                                  *(["--lookup-only", "--drafter", ""] if lookup_only
                                    else ["--drafter", f"{DEFAULT_HOST}:{drafter}"]),
                                  *(["--no-draft-ahead"] if getattr(args, "no_draft_ahead", False) else []),
                                  "--draft-length", str(args.draft_length or "auto"),
                                  *(["--max-draft-length", str(args.max_draft_length)]
                                    if getattr(args, "max_draft_length", None) else []),
                                  "--http-port", str(getattr(args, "http_port", -1)),
                                  "--unseeded-sampling", getattr(args, "unseeded_sampling", "coupled"),
                                  "--draft-confidence", str(args.draft_confidence), *pin(v_cpus), *metrics(0),
                                  *[arg for name in ("allowed_origins", "allowed_hosts") if getattr(args, name, "")
                                    for arg in (f"--{name.replace('_', '-')}", getattr(args, name))]],
                      port=args.gateway_port, label="gateway")
        cluster.wait_up(["gateway"], deadline)
        gateway = cluster.ports["gateway"]
    except BaseException:
        cluster.stop()
        raise
    finally:
        with contextlib.suppress(OSError):
            (log_dir / STATE_FILE).unlink()
    note(f"up: gateway {DEFAULT_HOST}:{gateway}  verifier {DEFAULT_HOST}:{verifier}  "
         + (f"drafter {DEFAULT_HOST}:{drafter}" if drafter else "no drafter (--lookup-only)"))
    return cluster


def _start_or_explain(args, command: str) -> Cluster | int:
    """The started cluster, or the exit code after saying why not (2: bad flags or a port in use, 1: a child
    failed to start)."""
    try:
        return start_cluster(args)
    except ValueError as exc:
        print(f"tandem {command}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except (StartupFailed, TimeoutError) as exc:
        print(f"tandem {command}: error: {exc}", file=sys.stderr, flush=True)
        return 1


def _tandem_command() -> str:
    """How the user can run ``tandem`` from here: bare when it is on PATH, else the venv's path."""
    import shutil

    exe = Path(sys.executable).with_name("tandem")
    found = shutil.which("tandem")
    return "tandem" if found and Path(found).resolve() == exe.resolve() else str(exe) if exe.exists() else "tandem"


def run(args) -> int:
    with stop_on_signals():
        cluster = None
        try:
            cluster = _start_or_explain(args, "up")
            if isinstance(cluster, int):
                return cluster
            tandem = _tandem_command()
            note(f'try: {tandem} generate --gateway {DEFAULT_HOST}:{cluster.ports["gateway"]} --chat '
                 '"Write a haiku about autumn."   (Ctrl-C stops all three)')
            if getattr(args, "http_port", -1) >= 0:
                note(f"chat page and OpenAI-compatible API: http://{DEFAULT_HOST}:{args.http_port}/  "
                     f"(base_url http://{DEFAULT_HOST}:{args.http_port}/v1)")
            return cluster.supervise()
        except Stop as stop:
            note(f"{stop}: stopping all three" if isinstance(cluster, Cluster) else f"{stop}: stopped while starting")
            return 0
        finally:
            if isinstance(cluster, Cluster):
                cluster.stop()
                note(f"stopped; logs kept in {cluster.log_dir}")


def run_demo(args) -> int:
    from types import SimpleNamespace

    from tandem.generate import generate_command

    with stop_on_signals():
        cluster = None
        try:
            cluster = _start_or_explain(args, "demo")
            if isinstance(cluster, int):
                return cluster
            gen = SimpleNamespace(prompt=args.prompt, gateway=f"{DEFAULT_HOST}:{cluster.ports['gateway']}",
                                  max_tokens=args.max_tokens, temperature=0.0, top_k=0, top_p=1.0, seed=None,
                                  draft_length=0, no_speculation=False, chat=True, ignore_eos=False, stream=False,
                                  json=False, trace=True, timeout=600.0)
            note(f"generating (greedy, chat template, {args.max_tokens} tokens max): {args.prompt!r}\n")
            return generate_command(gen)
        except Stop:
            return 130
        finally:
            if isinstance(cluster, Cluster):
                cluster.stop()
