"""The three services as separate processes (``python -m tandem.cli serve-*``), and a real OTLP/gRPC
trace receiver (opentelemetry-proto's TraceService) to point them at. Used by tests/e2e and by
tests/e2e/bench_tracing_overhead.py."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
from concurrent import futures
from pathlib import Path

import grpc

from procs import ServiceProcess, wait_healthy

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
