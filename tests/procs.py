"""The services as real processes (``python -m tandem.cli serve-...``) for the fault, network, tracing and
supervision tests (tests/e2e) and tests/e2e/bench_tracing_overhead.py: one ``ServiceProcess``, the three as
``Services``, and a real OTLP/gRPC trace receiver (opentelemetry-proto's TraceService) to point them at.

Every wait here is bounded in time; every process is stopped (TERM, then KILL) by ``close``. Health checks
use ``tandem.up_children.wait_healthy``, the one ``tandem up`` itself waits with.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

from tandem.up_children import wait_healthy

REPO = Path(__file__).resolve().parents[1]


class ServiceProcess:
    """``tandem serve-<kind> ... --port-file F``; ``prefix`` runs it under e.g. ``ip netns exec NS``."""

    def __init__(self, kind: str, args: list[str], log_dir: Path, name: str | None = None,
                 prefix: list[str] = (), env: dict | None = None, clean_env: bool = False):
        """``clean_env``: ``env`` is the whole environment (plus the test defaults), not added to os.environ."""
        self.kind, self.name = kind, name or kind
        self.log_dir = Path(log_dir)
        self.port_file = self.log_dir / f"{self.name}.port"
        self.port_file.unlink(missing_ok=True)
        self.log_path = self.log_dir / f"{self.name}.log"
        self.log = open(self.log_path, "a")
        full_env = {} if clean_env else dict(os.environ)
        full_env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
        full_env.update(env or {})
        full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        if kind == "gateway" and "--http-port" not in args:
            args = [*args, "--http-port", "-1"]          # tests that want the HTTP API ask for a port
        self.proc = subprocess.Popen([*prefix, sys.executable, "-m", "tandem.cli", f"serve-{kind}", *args,
                                      "--port-file", str(self.port_file)],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=full_env, cwd=REPO)
        self.port: int | None = None

    def wait_port(self, timeout: float = 120.0) -> int:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
            text = self.port_file.read_text().strip() if self.port_file.exists() else ""
            if text:
                self.port = int(text)
                return self.port
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} did not listen within {timeout}s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        return ""

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def close(self, grace: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


def free_port() -> int:
    """A TCP port free on loopback now (for a flag that wants a fixed port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, interval: float = 0.05) -> bool:
    """True once ``predicate()`` holds; False after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


# ---- OTLP receiver ---------------------------------------------------------------------------------
def _any_value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_any_value(x) for x in v.array_value.values)
    return getattr(v, kind) if kind else None


class OtlpReceiver:
    """An OTLP/gRPC collector that keeps every span it is sent, flattened to dicts."""

    def __init__(self):
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        receiver = self

        class Servicer(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                receiver._add(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        self.spans: list[dict] = []
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def _add(self, request) -> None:
        out = []
        for rs in request.resource_spans:
            service = {a.key: _any_value(a.value) for a in rs.resource.attributes}.get("service.name")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append({"service": service, "name": s.name, "trace_id": s.trace_id.hex(),
                                "span_id": s.span_id.hex(), "parent_id": s.parent_span_id.hex(), "kind": s.kind,
                                "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                                "attributes": {a.key: _any_value(a.value) for a in s.attributes}})
        with self._lock:
            self.spans.extend(out)

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.spans)

    def stop(self) -> None:
        self.server.stop(0)


# ---- the services as processes -----------------------------------------------------------------------
class Services:
    """Verifier, drafter and gateway as child processes on loopback; ``stop()`` sends SIGTERM and waits."""

    def __init__(self, target_dir, drafter_dir, env: dict | None = None, draft_length: int = 3,
                 extra: dict[str, list[str]] | None = None, startup_timeout: float = 300.0):
        self.dir = Path(tempfile.mkdtemp(prefix="tandem-procs-"))
        # Start from a clean telemetry/config environment: only what the test passes applies.
        base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TANDEM_"))}
        self.env = dict(base, **(env or {}))
        self.services: dict[str, ServiceProcess] = {}
        extra = extra or {}
        try:
            verifier = self._start("verifier", ["--target", str(target_dir), "--threads", "1",
                                                *extra.get("verifier", [])], startup_timeout)
            drafter = self._start("drafter", ["--drafter", str(drafter_dir), "--threads", "1",
                                              *extra.get("drafter", [])], startup_timeout)
            self._start("gateway", ["--verifier", f"127.0.0.1:{verifier}", "--drafter", f"127.0.0.1:{drafter}",
                                    "--draft-length", str(draft_length), *extra.get("gateway", [])], startup_timeout)
        except BaseException:
            self.stop()
            raise
        self.gateway_address = f"127.0.0.1:{self.services['gateway'].port}"

    def _start(self, name: str, args: list[str], timeout: float) -> int:
        svc = ServiceProcess(name, [*args, "--port", "0", "--grace", "1"], self.dir, env=self.env, clean_env=True)
        self.services[name] = svc
        port = svc.wait_port(timeout)
        wait_healthy(f"127.0.0.1:{port}", timeout)
        return port

    @property
    def procs(self) -> dict[str, subprocess.Popen]:
        return {name: svc.proc for name, svc in self.services.items()}

    def log(self, name: str) -> str:
        return self.services[name].tail(60) if name in self.services else ""

    def stop(self, timeout: float = 30.0) -> dict[str, int | None]:
        """SIGTERM to all (gateway first), then wait; returns the exit codes."""
        for name in ("gateway", "drafter", "verifier"):
            if name in self.services:
                self.services[name].signal(signal.SIGTERM)
        for svc in self.services.values():
            svc.close(timeout)
        return {name: svc.proc.returncode for name, svc in self.services.items()}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
