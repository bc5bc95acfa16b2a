"""``tandem up`` / ``tandem demo``: all three services as local processes on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem.affinity import check_cpus
from tandem.cli import DEFAULT_DRAFT_CONFIDENCE, DEFAULT_HOST, flag


def configure(p):
    flag(p, "target", "default", help="target model for the verifier ('default', .gguf or HF dir)")
    flag(p, "drafter", "default", help="drafter for the drafter service ('default' or a path)")
    flag(p, "gateway-port", 50051, int, help="gateway port (drafter and verifier take free ports)")
    flag(p, "draft-length", 2, int, help="default draft length k")
    flag(p, "draft-confidence", DEFAULT_DRAFT_CONFIDENCE, float, help="adaptive draft length: the drafter stops a "
         "block before a token it is less sure of than this (0 = always k)")
    flag(p, "drafter-threads", 1, int, help="ONNX Runtime threads of the drafter")
    flag(p, "verifier-threads", 0, int, help="torch threads of the verifier (0: torch's default)")
    flag(p, "verifier-cpus", None, help="pin the verifier and the gateway to these CPUs, e.g. '0' (Linux; "
         "unset: all)")
    flag(p, "drafter-cpus", None, help="pin the drafter to these CPUs, e.g. '1': with --verifier-cpus, drafting "
         "never competes with verification for cores, as on two machines")
    flag(p, "startup-timeout", 900.0, float, help="seconds to wait for all three to be healthy")
    flag(p, "log-dir", None, help="write each service's log here (default: a temporary folder)")
    flag(p, "metrics-port", None, int, help="Prometheus metrics: gateway on this port, verifier on +1, drafter on "
         "+2 (unset: off)")


def configure_demo(p):
    configure(p)
    p.add_argument("prompt", nargs="?", default="Write a haiku about autumn.", help="the prompt to generate from")
    flag(p, "max-tokens", 64, int, help="new tokens to generate")


@dataclass
class Cluster:
    log_dir: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

    def spawn(self, name: str, args: list[str]) -> None:
        port_file = self.log_dir / f"{name}.port"
        port_file.unlink(missing_ok=True)
        log = open(self.log_dir / f"{name}.log", "w")
        env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
        self.procs[name] = subprocess.Popen([sys.executable, "-m", "tandem.cli", f"serve-{name}", *args,
                                             "--port-file", str(port_file)],
                                            stdout=log, stderr=subprocess.STDOUT, env=env)

    def wait_port(self, name: str, deadline: float) -> int:
        port_file = self.log_dir / f"{name}.port"
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited with code {self.procs[name].returncode}; its log "
                                   f"({self.log_dir / (name + '.log')}) ends with:\n{self.tail(name)}")
            if port_file.exists() and port_file.read_text().strip():
                self.ports[name] = int(port_file.read_text())
                wait_healthy(f"{DEFAULT_HOST}:{self.ports[name]}", deadline)
                return self.ports[name]
            time.sleep(0.2)
        raise TimeoutError(f"{name} did not come up in time; log:\n{self.tail(name)}")

    def tail(self, name: str, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join((self.log_dir / f"{name}.log").read_text().splitlines()[-lines:])
        return ""

    def stop(self, grace: float = 10.0) -> None:
        # The gateway first: its in-flight requests still need the drafter and the verifier to finish.
        order = sorted(self.procs.values(), key=lambda p: p is not self.procs.get("gateway"))
        end = time.monotonic() + grace
        for proc in order:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            if proc is self.procs.get("gateway"):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(max(0.1, end - time.monotonic()))
        for proc in order:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, end - time.monotonic()))
            if proc.poll() is None:
                proc.kill()


def wait_healthy(address: str, deadline: float) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)


def start_cluster(args) -> Cluster:
    """Starts verifier, drafter and gateway; raises ValueError on bad CPU lists before starting any."""
    v_cpus = getattr(args, "verifier_cpus", None)
    d_cpus = getattr(args, "drafter_cpus", None)
    for name, spec in (("verifier", v_cpus), ("drafter", d_cpus)):
        if spec:
            try:
                check_cpus(spec)
            except (ValueError, RuntimeError) as exc:
                raise ValueError(f"--{name}-cpus: {exc}") from None
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="tandem-up-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(log_dir)
    deadline = time.monotonic() + args.startup_timeout
    print(f"[tandem] starting verifier ({args.target}) and drafter ({args.drafter}); logs in {log_dir}",
          file=sys.stderr, flush=True)
    base = getattr(args, "metrics_port", None)
    metrics = (lambda n: ["--metrics-port", str(base + n)]) if base else (lambda n: [])
    pin = (lambda cpus: ["--cpus", str(cpus)] if cpus else [])
    try:
        cluster.spawn("verifier", ["--target", args.target, "--port", "0", "--threads", str(args.verifier_threads),
                                   *pin(v_cpus), *metrics(1)])
        cluster.spawn("drafter", ["--drafter", args.drafter, "--port", "0", "--threads", str(args.drafter_threads),
                                  *pin(d_cpus), *metrics(2)])
        verifier = cluster.wait_port("verifier", deadline)
        drafter = cluster.wait_port("drafter", deadline)
        cluster.spawn("gateway", ["--verifier", f"{DEFAULT_HOST}:{verifier}", "--drafter", f"{DEFAULT_HOST}:{drafter}",
                                  "--port", str(args.gateway_port), "--draft-length", str(args.draft_length),
                                  "--draft-confidence", str(args.draft_confidence), *pin(v_cpus), *metrics(0)])
        gateway = cluster.wait_port("gateway", deadline)
    except BaseException:
        cluster.stop()
        raise
    print(f"[tandem] up: gateway {DEFAULT_HOST}:{gateway}  verifier {DEFAULT_HOST}:{verifier}  "
          f"drafter {DEFAULT_HOST}:{drafter}", file=sys.stderr, flush=True)
    return cluster


def _start_or_explain(args) -> Cluster | None:
    try:
        return start_cluster(args)
    except ValueError as exc:
        print(f"tandem: error: {exc}", file=sys.stderr)
        return None


def run(args) -> int:
    cluster = _start_or_explain(args)
    if cluster is None:
        return 2
    print(f'[tandem] try: tandem generate --gateway {DEFAULT_HOST}:{cluster.ports["gateway"]} --chat '
          '"Write a haiku about autumn."   (Ctrl-C stops all three)', file=sys.stderr, flush=True)
    try:
        while all(p.poll() is None for p in cluster.procs.values()):
            time.sleep(0.5)
        dead = [n for n, p in cluster.procs.items() if p.poll() is not None]
        print(f"[tandem] {', '.join(dead)} exited; stopping the rest. Log tail:\n{cluster.tail(dead[0])}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        cluster.stop()


def run_demo(args) -> int:
    from types import SimpleNamespace

    from tandem.client import generate_command

    cluster = _start_or_explain(args)
    if cluster is None:
        return 2
    try:
        gen = SimpleNamespace(prompt=args.prompt, gateway=f"{DEFAULT_HOST}:{cluster.ports['gateway']}",
                              max_tokens=args.max_tokens, temperature=0.0, top_k=0, top_p=1.0, seed=None,
                              draft_length=0, no_speculation=False, chat=True, ignore_eos=False, stream=False,
                              json=False, trace=True, timeout=600.0)
        print(f"[tandem] generating (greedy, chat template, {args.max_tokens} tokens max): {args.prompt!r}\n",
              file=sys.stderr, flush=True)
        return generate_command(gen)
    finally:
        cluster.stop()
