"""The three services as separate processes (``python -m tandem.cli serve-*``), and a real OTLP/gRPC
trace receiver (opentelemetry-proto's TraceService) to point them at. Used by tests/e2e and by
tests/e2e/bench_tracing_overhead.py."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[1]


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
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TANDEM_"))}
        self.env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
                        PYTHONPATH=str(REPO), **(env or {}))
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}
        extra = extra or {}
        deadline = time.monotonic() + startup_timeout
        try:
            self._spawn("verifier", ["--target", str(target_dir), "--threads", "1", *extra.get("verifier", [])])
            self._spawn("drafter", ["--drafter", str(drafter_dir), "--threads", "1", *extra.get("drafter", [])])
            verifier, drafter = self._wait("verifier", deadline), self._wait("drafter", deadline)
            self._spawn("gateway", ["--verifier", f"127.0.0.1:{verifier}", "--drafter", f"127.0.0.1:{drafter}",
                                    "--draft-length", str(draft_length), *extra.get("gateway", [])])
            self._wait("gateway", deadline)
        except BaseException:
            self.stop()
            raise
        self.gateway_address = f"127.0.0.1:{self.ports['gateway']}"

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.dir / f"{name}.log", "w")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "tandem.cli", f"serve-{name}", *args, "--port", "0", "--grace", "1",
             "--port-file", str(self.dir / f"{name}.port")], stdout=log, stderr=subprocess.STDOUT, env=self.env,
            cwd=REPO)

    def _wait(self, name: str, deadline: float) -> int:
        from tandem.up import wait_healthy

        port_file = self.dir / f"{name}.port"
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited ({self.procs[name].returncode}):\n{self.log(name)}")
            if port_file.exists() and port_file.read_text().strip():
                self.ports[name] = int(port_file.read_text())
                wait_healthy(f"127.0.0.1:{self.ports[name]}", deadline)
                return self.ports[name]
            time.sleep(0.1)
        raise TimeoutError(f"{name} did not come up:\n{self.log(name)}")

    def log(self, name: str) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / f"{name}.log").read_text()[-4000:]
        return ""

    def stop(self, timeout: float = 30.0) -> dict[str, int | None]:
        """SIGTERM to all (gateway first), then wait; returns the exit codes."""
        for name in ("gateway", "drafter", "verifier"):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + timeout
        codes = {}
        for name, proc in self.procs.items():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, end - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            codes[name] = proc.returncode
        return codes

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
