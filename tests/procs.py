"""Services as real processes (``python -m tandem.cli serve-...``) for the fault and network tests.

Every wait here is bounded in time; every process is stopped (TERM, then KILL) by ``close``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

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


def wait_healthy(address: str, timeout: float = 60.0, credentials=None) -> None:
    """Polls the gRPC health service until SERVING (bounded)."""
    end = time.monotonic() + timeout
    channel = grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status == \
                        health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > end:
                raise TimeoutError(f"{address} not healthy within {timeout}s")
            time.sleep(0.1)


def wait_until(predicate, timeout: float, interval: float = 0.05) -> bool:
    """True once ``predicate()`` holds; False after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
