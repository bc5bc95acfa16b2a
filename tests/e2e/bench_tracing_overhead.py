"""Tracing overhead per round on loopback: two clusters of three processes (tiny models), one exporting
every span over OTLP/gRPC to a receiver in this process, one with tracing off; requests alternate
between them so that drift on a shared machine hits both alike.

    python tests/e2e/bench_tracing_overhead.py [--requests 40] [--max-tokens 64] [--target DIR --drafter DIR]

Without --target/--drafter it builds the tiny test models (as tests/conftest.py does) in a temp dir.
Prints per-round wall time (the gateway's round_ms: draft + verify + network) for both, and the overhead.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import grpc  # noqa: E402

from procs import OtlpReceiver, Services  # noqa: E402
from tandem.pb import gateway_grpc, gateway_pb2  # noqa: E402


def tiny_models(root: Path) -> tuple[Path, Path]:
    from tandem.export import export_drafter
    from tiny_models import make_tiny_model

    target = make_tiny_model(root / "target", seed=1)
    drafter = make_tiny_model(root / "drafter", seed=2, hidden=16, layers=1, heads=2, kv_heads=1)
    export_drafter(drafter, root / "drafter_onnx", check=False)
    return target, root / "drafter_onnx"


def cpu_seconds(services: Services) -> dict[str, float]:
    """user + system CPU seconds of each of the cluster's three processes so far (Linux /proc)."""
    out = {}
    for name, proc in services.procs.items():
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        out[name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")   # utime, stime
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=40, help="requests per configuration")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--target")
    ap.add_argument("--drafter")
    ap.add_argument("--on-env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment of the traced cluster (e.g. OTEL_TRACES_SAMPLER=always_off)")
    args = ap.parse_args()
    if args.target and args.drafter:
        target, drafter = Path(args.target), Path(args.drafter)
    else:
        target, drafter = tiny_models(Path(tempfile.mkdtemp(prefix="tandem-bench-")))

    receiver = OtlpReceiver()
    env_on = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_TRACES_SAMPLER": "always_on",
              **dict(kv.split("=", 1) for kv in args.on_env)}
    clusters = {"off": Services(target, drafter, draft_length=args.k),
                "on": Services(target, drafter, env=env_on, draft_length=args.k)}
    rounds: dict[str, list[float]] = {"off": [], "on": []}
    totals: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, dict[str, float]] = {"off": {}, "on": {}}
    try:
        channels = {n: grpc.insecure_channel(c.gateway_address) for n, c in clusters.items()}
        stubs = {n: gateway_grpc.GatewayStub(ch) for n, ch in channels.items()}
        prompts = [f"w{i % 50 + 1} w{(3 * i) % 50 + 1} w{(7 * i) % 50 + 1}" for i in range(args.requests)]
        for i in range(-3, args.requests):              # 3 warm-up requests each
            order = ("off", "on") if i % 2 else ("on", "off")
            for name in order:
                req = gateway_pb2.GenerateRequest(prompt=prompts[max(i, 0)], max_tokens=args.max_tokens,
                                                  ignore_eos=True, draft_length=args.k)
                c0, t0 = cpu_seconds(clusters[name]), time.perf_counter()
                reply = stubs[name].Generate(req, timeout=600)
                if i >= 0:
                    for proc, secs in cpu_seconds(clusters[name]).items():
                        cpu[name][proc] = cpu[name].get(proc, 0.0) + secs - c0[proc]
                    totals[name].append((time.perf_counter() - t0) * 1e3)
                    rounds[name].extend(r.round_ms for r in reply.stats.round_stats)
        for ch in channels.values():
            ch.close()
    finally:
        for c in clusters.values():
            c.stop()
        time.sleep(0.5)
        spans = len(receiver.snapshot())
        receiver.stop()

    def describe(xs):
        return (f"n={len(xs):5d}  mean {statistics.fmean(xs):7.3f} ms  median {statistics.median(xs):7.3f} ms  "
                f"p90 {statistics.quantiles(xs, n=10)[-1]:7.3f} ms")

    print(f"{'tiny models' if not args.target else f'{args.target} / {args.drafter}'}, k={args.k}, {args.requests} requests x {args.max_tokens} tokens per configuration; "
          f"{spans} spans exported")
    for name in ("off", "on"):
        print(f"round ms, tracing {name:3s}: {describe(rounds[name])}")
        print(f"request ms, tracing {name:3s}: {describe(totals[name])}")
    cpu_round = {n: 1e3 * sum(cpu[n].values()) / len(rounds[n]) for n in cpu}
    for name in ("off", "on"):
        each = "  ".join(f"{p} {1e3 * c / len(rounds[name]):.3f}" for p, c in sorted(cpu[name].items()))
        print(f"CPU ms per round, tracing {name:3s}: {cpu_round[name]:7.3f}  ({each}; export threads included)")
    print(f"CPU overhead per round: {cpu_round['on'] - cpu_round['off']:+.3f} ms = "
          f"{100 * (cpu_round['on'] - cpu_round['off']) / cpu_round['off']:+.2f} %")
    for stat in (statistics.fmean, statistics.median):
        off, on = stat(rounds["off"]), stat(rounds["on"])
        print(f"overhead per round ({stat.__name__}): {on - off:+.3f} ms = {100 * (on - off) / off:+.2f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
