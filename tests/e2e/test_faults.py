"""Faults with tiny models and real gRPC: a drafter killed mid-generation and restarted, a stopped or frozen
verifier, graceful stop, cancelled clients, idle-session eviction, and backpressure.

Services that must die or freeze run as separate processes (``tandem serve-...``); the rest run in
this process (tests/harness.py's loop thread) so the test can look at their sessions.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import grpc
import pytest

from harness import InProcessGateway
from procs import ServiceProcess, free_port, wait_healthy, wait_until
from tandem.pb import common_pb2, drafter_pb2, gateway_grpc, gateway_pb2, verifier_grpc, verifier_pb2

N = 256


def req(**kw):
    kw.setdefault("prompt", "w1 w5 w9 w20")
    kw.setdefault("max_tokens", N)
    kw.setdefault("ignore_eos", True)
    return gateway_pb2.GenerateRequest(**kw)


@pytest.fixture(scope="module")
def target(tiny_long_target_dir):
    from verifier_service.target import Target

    return Target.load(str(tiny_long_target_dir))


@pytest.fixture(scope="module")
def verifier(lt, target):
    from verifier_service.server import start_verifier

    service = lt.run(start_verifier(target))
    yield f"127.0.0.1:{service.port}"
    lt.run(service.stop(0))


def Gw(lt, verifier_addr, drafter_addr, **config) -> InProcessGateway:
    """An in-process gateway and a client stub for it: k = 4, a failed drafter probed again quickly."""
    return InProcessGateway(lt, verifier_addr, drafter_addr, dict(draft_length=4, max_tokens_limit=512,
                                                                  drafter_retry_s=0.2, drafter_retry_max_s=1.0),
                            **config)


def test_drafter_killed_mid_generation_then_restarted(lt, target, verifier, tiny_long_drafter_onnx, tmp_path):
    """Kill -9 the drafter during a 256-token generation: the call completes with target-only decoding and
    the greedy output of plain decoding; restart it: the gateway reconnects and speculates again."""
    args = ["--drafter", str(tiny_long_drafter_onnx), "--threads", "1"]
    drafter = ServiceProcess("drafter", [*args, "--port", "0"], tmp_path)
    port = drafter.wait_port(60)
    wait_healthy(f"127.0.0.1:{port}")
    gw = Gw(lt, verifier, f"127.0.0.1:{port}")
    try:
        plain = gw.stub.Generate(req(no_speculation=True), timeout=120)
        assert len(plain.token_ids) == N

        tokens, killed_after, last = [], None, None
        for chunk in gw.stub.GenerateStream(req(draft_length=4), timeout=120):
            tokens.extend(chunk.token_ids)
            if killed_after is None and len(tokens) >= 8:
                drafter.kill()
                killed_after = len(tokens)
            last = chunk
        stats = last.stats
        assert tokens == list(plain.token_ids), "output differs from plain decoding after the drafter died"
        assert stats.speculative and stats.proposed > 0, "the request never speculated"
        assert "drafter unavailable" in stats.fallback_reason
        ks = [r.k for r in stats.round_stats]
        first_plain = ks.index(0)
        assert first_plain > 0 and all(k == 0 for k in ks[first_plain:]), ks     # speculation, then target only
        assert sum(len(c) for c in [tokens[killed_after:]]) > 0
        assert not gw.gateway.drafter_healthy
        assert len(target.sessions) == 0

        # while it is down: requests complete with the target alone, without waiting for the drafter
        t0 = time.monotonic()
        down = gw.stub.Generate(req(max_tokens=16), timeout=30)
        assert not down.stats.speculative and down.stats.fallback_reason and len(down.token_ids) == 16
        assert time.monotonic() - t0 < 5

        # restart on the same address: the gateway's probe (backoff 0.2 s .. 1 s here) finds it again
        drafter = ServiceProcess("drafter", [*args, "--port", str(port)], tmp_path, name="drafter2")
        drafter.wait_port(60)
        wait_healthy(f"127.0.0.1:{port}")
        assert wait_until(lambda: gw.gateway.drafter_healthy, 20), gw.gateway.drafter_down_reason
        again = gw.stub.Generate(req(draft_length=4), timeout=120)
        assert again.stats.speculative and again.stats.proposed > 0 and not again.stats.fallback_reason
        assert list(again.token_ids) == list(plain.token_ids)
    finally:
        gw.close()
        drafter.close()


def test_a_followed_model_free_node_killed_mid_generation_costs_speed_only(lt, target, verifier, tmp_path):
    """The model-free (suffix) node, followed by the path it drafts ahead (gateway/proposal.py): kill -9 it
    while a repeated request is drafted from its path. The request completes with plain decoding's output,
    the round after the stream broke names the drafter, and every round after it is a plain step."""
    drafter = ServiceProcess("drafter", ["--drafter", "suffix", "--suffix-seed", "none", "--port", "0"], tmp_path)
    port = drafter.wait_port(60)
    wait_healthy(f"127.0.0.1:{port}")
    gw = Gw(lt, verifier, f"127.0.0.1:{port}")
    try:
        plain = gw.stub.Generate(req(no_speculation=True), timeout=120)
        first = gw.stub.Generate(req(draft_length=4), timeout=120)       # the node learns the reply
        assert list(first.token_ids) == list(plain.token_ids)
        tokens, last = [], None
        for chunk in gw.stub.GenerateStream(req(draft_length=4), timeout=120):
            tokens.extend(chunk.token_ids)
            if len(tokens) >= 32 and drafter.proc.poll() is None:
                drafter.kill()
            last = chunk
        stats = last.stats
        assert tokens == list(plain.token_ids), "output differs from plain decoding after the node died"
        assert stats.proposed >= 16 and "drafter unavailable" in stats.fallback_reason
        rounds = list(stats.round_stats)
        failed = [i for i, r in enumerate(rounds) if r.fallback_reason]
        assert len(failed) == 1 and all(r.k == 0 for r in rounds[failed[0]:]), [(r.k, r.source) for r in rounds]
        assert {r.source for r in rounds[:failed[0]] if r.proposed} <= {"ahead", "copy"}
        assert len(target.sessions) == 0
    finally:
        gw.close()
        drafter.close()


def test_drafter_killed_after_the_last_propose_is_named(lt, target, verifier, tiny_long_drafter_onnx, tmp_path):
    """Kill -9 the drafter in a request's last round, after its last Propose (as in a plain streak of the
    automatic draft length): the output is plain decoding's, and fallback_reason names the drafter that was
    found dead when the request ended its session; the gateway marks it down for the next requests. (The
    Propose path, --no-draft-ahead: a DraftAhead stream is half-closed without waiting at the end of a request,
    so a drafter found dead then is named by the next request.)"""
    args = ["--drafter", str(tiny_long_drafter_onnx), "--threads", "1"]
    drafter = ServiceProcess("drafter", [*args, "--port", "0"], tmp_path)
    port = drafter.wait_port(60)
    wait_healthy(f"127.0.0.1:{port}")
    gw = Gw(lt, verifier, f"127.0.0.1:{port}", draft_ahead=False)
    n = 64
    real = gw.gateway.verifier

    class KillInTheLastRound:
        """The gateway's verifier client; kills the drafter once a Verify completes the request's tokens."""

        def __init__(self):
            self.emitted = 0

        def __getattr__(self, name):
            return getattr(real, name)

        async def start(self, *a, **kw):
            self.emitted = 1
            return await real.start(*a, **kw)

        async def verify(self, *a, **kw):
            outcome = await real.verify(*a, **kw)
            self.emitted += outcome.accepted + 1
            if self.emitted >= n and drafter.proc.poll() is None:
                drafter.kill()
            return outcome

    try:
        plain = gw.stub.Generate(req(no_speculation=True, max_tokens=n), timeout=120)
        gw.gateway.verifier = KillInTheLastRound()
        reply = gw.stub.Generate(req(draft_length=4, max_tokens=n), timeout=120)
        assert drafter.proc.poll() is not None, "the drafter was not killed"
        assert list(reply.token_ids) == list(plain.token_ids)
        stats = reply.stats
        ks = [r.k for r in stats.round_stats]       # (the last round may be a plain step: one token left)
        assert stats.speculative and 0 not in ks[:-1], f"it fell back before the kill: {ks}"
        assert "drafter unavailable" in stats.fallback_reason and f":{port}" in stats.fallback_reason
        assert not gw.gateway.drafter_healthy and gw.gateway.drafter_down_reason
    finally:
        gw.gateway.verifier = real
        gw.close()
        drafter.close()


def test_drafter_down_at_start_then_coming_up(lt, verifier, tiny_long_drafter_onnx):
    """A gateway started before its drafter decodes target-only, then speculates once the drafter is up."""
    from drafter_service.onnx_drafter import OnnxDrafter
    from drafter_service.server import start_drafter

    port = free_port()
    gw = Gw(lt, verifier, f"127.0.0.1:{port}")
    service = None
    try:
        first = gw.stub.Generate(req(max_tokens=8), timeout=30)
        assert not first.stats.speculative and "UNAVAILABLE" in first.stats.fallback_reason
        service = lt.run(start_drafter(OnnxDrafter(tiny_long_drafter_onnx, threads=1), port=port))
        assert wait_until(lambda: gw.gateway.drafter_healthy, 20), gw.gateway.drafter_down_reason
        later = gw.stub.Generate(req(max_tokens=8), timeout=30)
        assert later.stats.speculative and later.stats.proposed > 0
    finally:
        gw.close()
        if service is not None:
            lt.run(service.stop(0))


def test_stopped_or_frozen_verifier_gives_unavailable_within_the_deadline(lt, tiny_long_target_dir, tmp_path):
    proc = ServiceProcess("verifier", ["--target", str(tiny_long_target_dir), "--port", "0", "--threads", "1",
                                       "--grace", "1"], tmp_path)
    gw = None
    try:
        addr = f"127.0.0.1:{proc.wait_port(120)}"
        wait_healthy(addr)
        gw = Gw(lt, addr, None)
        assert len(gw.stub.Generate(req(max_tokens=8), timeout=30).token_ids) == 8

        # frozen (SIGSTOP: the socket accepts, nothing answers): UNAVAILABLE before the client's deadline
        proc.signal(signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            gw.stub.Generate(req(max_tokens=8), timeout=3)
        elapsed = time.monotonic() - t0
        # UNAVAILABLE (not DEADLINE_EXCEEDED) is the proof it came within the client's deadline, which
        # gRPC starts a little after t0
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value
        assert "verifier" in err.value.details() and elapsed < 3.5
        proc.signal(signal.SIGCONT)
        assert len(gw.stub.Generate(req(max_tokens=8), timeout=30).token_ids) == 8

        # stopped (SIGTERM, graceful): UNAVAILABLE at once
        proc.signal(signal.SIGTERM)
        assert proc.proc.wait(15) == 0
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            gw.stub.Generate(req(max_tokens=8), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "verifier" in err.value.details()
        assert time.monotonic() - t0 < 5
        assert gw.gateway.active_requests == 0
    finally:
        if gw is not None:
            gw.close()
        proc.close()


def test_graceful_stop_lets_in_flight_requests_finish(lt, verifier, tiny_long_drafter_onnx, tmp_path):
    """SIGTERM to the gateway during a 256-token stream: the stream completes; new calls are refused."""
    from drafter_service.onnx_drafter import OnnxDrafter
    from drafter_service.server import start_drafter

    drafter = lt.run(start_drafter(OnnxDrafter(tiny_long_drafter_onnx, threads=1)))
    proc = ServiceProcess("gateway", ["--verifier", verifier, "--drafter", f"127.0.0.1:{drafter.port}",
                                      "--port", "0", "--grace", "30", "--max-tokens-limit", "512"], tmp_path)
    try:
        addr = f"127.0.0.1:{proc.wait_port(120)}"
        wait_healthy(addr)
        with grpc.insecure_channel(addr) as ch:
            stub = gateway_grpc.GatewayStub(ch)
            tokens, last, stopped = [], None, False
            for chunk in stub.GenerateStream(req(draft_length=2), timeout=120):
                tokens.extend(chunk.token_ids)
                if not stopped:
                    proc.signal(signal.SIGTERM)
                    stopped = True
                last = chunk
            assert len(tokens) == N and last.finish_reason == "length"
            assert proc.proc.wait(30) == 0
            with pytest.raises(grpc.RpcError) as err:
                stub.Generate(req(max_tokens=4), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "stopping (grace 30s)" in proc.tail()
    finally:
        proc.close()
        lt.run(drafter.stop(0))


@pytest.fixture
def stack(lt, target, verifier, tiny_long_drafter_onnx):
    from drafter_service.onnx_drafter import OnnxDrafter
    from drafter_service.server import start_drafter

    onnx = OnnxDrafter(tiny_long_drafter_onnx, threads=1)
    service = lt.run(start_drafter(onnx))
    gw = Gw(lt, verifier, f"127.0.0.1:{service.port}", max_concurrent_requests=2)
    gw.drafter = onnx
    yield gw
    gw.close()
    lt.run(service.stop(0))


def test_cancelled_requests_free_their_sessions_at_once(stack, target):
    stream = stack.stub.GenerateStream(req(draft_length=3), timeout=60)
    next(stream), next(stream)
    assert len(target.sessions) == 1
    stream.cancel()
    assert wait_until(lambda: len(target.sessions) == 0 and stack.drafter.session_count() == 0, 2.0)
    future = stack.stub.Generate.future(req(draft_length=3), timeout=60)
    assert wait_until(lambda: len(target.sessions) == 1, 5.0, 0.001)
    future.cancel()
    assert wait_until(lambda: len(target.sessions) == 0 and stack.drafter.session_count() == 0, 2.0)
    # the request's slot (--max-concurrent-requests) is given back just after its sessions are ended
    assert wait_until(lambda: stack.gateway.active_requests == 0, 2.0)


def test_beyond_max_concurrent_requests_is_resource_exhausted_at_once(stack, target):
    gate = threading.Event()
    real_start = target.astart                                   # what the verifier's StartSession awaits

    async def held_start(*a, **kw):                              # held off the loop the servers share
        await asyncio.get_running_loop().run_in_executor(None, gate.wait, 30)
        return await real_start(*a, **kw)

    target.astart = held_start
    try:
        held = [stack.stub.Generate.future(req(max_tokens=8), timeout=60) for _ in range(2)]
        assert wait_until(lambda: stack.gateway.active_requests == 2, 10)
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            stack.stub.Generate(req(max_tokens=8), timeout=30)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-concurrent-requests" in \
            err.value.details()
        assert time.monotonic() - t0 < 1.0                       # refused at once, not queued
        gate.set()
        assert all(len(f.result(30).token_ids) == 8 for f in held)
        assert len(stack.stub.Generate(req(max_tokens=8), timeout=30).token_ids) == 8
    finally:
        gate.set()
        del target.astart


def test_idle_sessions_are_evicted_after_the_ttl(lt, tiny_long_target_dir, tiny_long_drafter_onnx):
    from drafter_service.onnx_drafter import OnnxDrafter
    from drafter_service.server import start_drafter
    from verifier_service.server import start_verifier
    from verifier_service.target import Target

    t = Target.load(str(tiny_long_target_dir), session_ttl_s=1.0)
    d = OnnxDrafter(tiny_long_drafter_onnx, threads=1, session_ttl_s=1.0)
    vs, ds = lt.run(start_verifier(t)), lt.run(start_drafter(d))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{vs.port}") as vc, grpc.insecure_channel(f"127.0.0.1:{ds.port}") as dc:
            verifier_grpc.VerifierStub(vc).StartSession(verifier_pb2.StartSessionRequest(
                session_id="idle", prompt_ids=[1, 5, 6], sampling=common_pb2.SamplingParams()), timeout=30)
            from tandem.pb import drafter_grpc

            drafter_grpc.DrafterStub(dc).Propose(drafter_pb2.ProposeRequest(
                session_id="idle", appended_tokens=[1, 5, 6], k=2), timeout=30)
        assert len(t.sessions) == 1 and d.session_count() == 1
        # TTL 1 s: the evictors run every 0.5 s (a quarter of the TTL, at least 0.5 s)
        assert wait_until(lambda: len(t.sessions) == 0 and d.session_count() == 0, 5.0, 0.1)
    finally:
        lt.run(vs.stop(0))
        lt.run(ds.stop(0))
