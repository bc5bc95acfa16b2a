"""Many clients at once: 16 concurrent clients for TANDEM_LOAD_SECONDS (default 15 s; the full run is
60 s) against a gateway limited to 8 concurrent requests, with cancellations mixed in (streams dropped after
a few chunks, unary calls cancelled in flight). Expected: no errors other than RESOURCE_EXHAUSTED beyond the
limit (and CANCELLED for the calls the clients cancelled themselves); every greedy completion equals plain
decoding; afterwards zero sessions on the drafter and the verifier and no request slot held.

Tiny models, real gRPC on loopback, all three services in this process so their sessions can be counted.
"""

from __future__ import annotations

import collections
import os
import random
import threading
import time

import grpc
import pytest

from harness import LoopThread
from procs import wait_until
from tandem.pb import common_pb2, gateway_grpc, gateway_pb2

CLIENTS = 16
LIMIT = 8
DURATION_S = float(os.environ.get("TANDEM_LOAD_SECONDS", "15"))
PROMPTS = ["w1 w5 w9 w20", "w3 w4", "w7 w7 w8 w30 w31", "w12"]
MAX_CALLS_PER_CLIENT = 100_000          # a bound besides the time


@pytest.fixture(scope="module")
def services(tiny_long_target_dir, tiny_long_drafter_onnx):
    from drafter_service.onnx_drafter import OnnxDrafter
    from drafter_service.server import start_drafter
    from gateway.engine import GatewayConfig
    from gateway.server import connect_gateway, start_gateway
    from verifier_service.server import start_verifier
    from verifier_service.target import Target

    lt = LoopThread()
    target = Target.load(str(tiny_long_target_dir))
    drafter = OnnxDrafter(tiny_long_drafter_onnx, threads=1)
    vs, ds = lt.run(start_verifier(target)), lt.run(start_drafter(drafter))
    gateway = lt.run(connect_gateway(f"127.0.0.1:{vs.port}", f"127.0.0.1:{ds.port}",
                                     GatewayConfig(draft_length=4, max_tokens_limit=512,
                                                   max_concurrent_requests=LIMIT), wait_s=60))
    gs = lt.run(start_gateway(gateway))
    yield target, drafter, gateway, f"127.0.0.1:{gs.port}"
    for s in (gs, ds, vs):
        lt.run(s.stop(0))
    lt.close()


def test_concurrent_clients_with_cancellations(services):
    target, drafter, gateway, address = services
    with grpc.insecure_channel(address) as ch:
        stub = gateway_grpc.GatewayStub(ch)
        reference = {p: list(stub.Generate(gateway_pb2.GenerateRequest(prompt=p, max_tokens=64, ignore_eos=True,
                                                                       no_speculation=True), timeout=60).token_ids)
                     for p in PROMPTS}

    counts: collections.Counter = collections.Counter()
    errors: list[str] = []
    mismatches: list[str] = []
    latencies: list[float] = []
    tokens = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + DURATION_S

    def client(i: int) -> None:
        rng = random.Random(i)
        with grpc.insecure_channel(address) as channel:
            stub = gateway_grpc.GatewayStub(channel)
            for _ in range(MAX_CALLS_PER_CLIENT):
                if time.monotonic() >= deadline:
                    return
                prompt = rng.choice(PROMPTS)
                n = rng.randint(4, 64)
                sampled = rng.random() < 0.25
                request = gateway_pb2.GenerateRequest(
                    prompt=prompt, max_tokens=n, ignore_eos=True, draft_length=rng.randint(0, 6),
                    no_speculation=rng.random() < 0.1,
                    sampling=common_pb2.SamplingParams(temperature=0.8, top_p=0.95, seed=i, has_seed=True)
                    if sampled else None)
                action = rng.choices(["unary", "stream", "cancel_stream", "cancel_unary"], [4, 2, 1, 1])[0]
                t0 = time.monotonic()
                try:
                    if action == "unary":
                        reply = stub.Generate(request, timeout=60)
                        got = list(reply.token_ids)
                    elif action == "stream":
                        got = [t for c in stub.GenerateStream(request, timeout=60) for t in c.token_ids]
                    elif action == "cancel_stream":
                        stream = stub.GenerateStream(request, timeout=60)
                        for j, _ in enumerate(stream):
                            if j >= rng.randint(0, 3):
                                break
                        stream.cancel()
                        with lock:
                            counts["cancelled"] += 1
                        continue
                    else:
                        future = stub.Generate.future(request, timeout=60)
                        time.sleep(rng.uniform(0, 0.03))
                        if future.cancel():
                            with lock:
                                counts["cancelled"] += 1
                            continue
                        got = list(future.result().token_ids)     # finished before the cancel: check it
                except grpc.RpcError as err:
                    with lock:
                        if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                            counts["resource_exhausted"] += 1
                        elif err.code() == grpc.StatusCode.CANCELLED and action.startswith("cancel"):
                            counts["cancelled"] += 1
                        else:
                            errors.append(f"{action}: {err.code().name}: {err.details()}")
                    time.sleep(rng.uniform(0.05, 0.2))            # a polite client backs off a little
                    continue
                with lock:
                    counts["ok"] += 1
                    tokens[0] += len(got)
                    latencies.append(time.monotonic() - t0)
                    if len(got) != n:
                        mismatches.append(f"{action}: {len(got)} tokens for max_tokens={n}")
                    elif not sampled and got != reference[prompt][:n]:
                        mismatches.append(f"{action}: greedy output differs from plain decoding ({prompt!r})")

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DURATION_S + 120)
    assert not any(t.is_alive() for t in threads), "a client did not stop"
    elapsed = time.monotonic() - (deadline - DURATION_S)

    freed = wait_until(lambda: len(target.sessions) == 0 and drafter.session_count() == 0
                       and gateway.active_requests == 0, 10.0)
    latencies.sort()
    summary = (f"{CLIENTS} clients x {DURATION_S:.0f}s (limit {LIMIT}): {counts['ok']} completed, "
               f"{counts['resource_exhausted']} RESOURCE_EXHAUSTED, {counts['cancelled']} cancelled by the client, "
               f"{len(errors)} other errors; {tokens[0]} tokens, {tokens[0] / elapsed:.0f} tok/s overall; "
               f"latency p50 {latencies[len(latencies) // 2] * 1e3:.0f} ms, "
               f"p95 {latencies[int(len(latencies) * 0.95)] * 1e3:.0f} ms; after: verifier sessions "
               f"{len(target.sessions)}, drafter sessions {drafter.session_count()}, "
               f"active requests {gateway.active_requests}")
    print("\n[load] " + summary)
    assert not errors, errors[:10]
    assert not mismatches, mismatches[:10]
    assert counts["ok"] > CLIENTS and counts["cancelled"] > 0 and counts["resource_exhausted"] > 0, summary
    assert freed, summary
