"""Trust nothing on the wire: a misbehaving drafter costs speed, never the request; the
verifier refuses a q that cannot be the drafter's; sessions belong to their creator; every node bounds
what it accepts and answers malformed messages with INVALID_ARGUMENT."""

from __future__ import annotations

import grpc
import pytest

from tandem.pb_convert import info_to_pb
from tandem.pb import common_pb2, drafter_pb2, gateway_grpc, gateway_pb2
from tandem.serving import start_service

# ---- a drafter that misbehaves in one chosen way -------------------------------------------------------
MODES = ["invalid_argument", "failed_precondition", "id_out_of_vocab", "undecodable", "too_many_tokens",
         "q_missing", "q_zero", "q_sums_to_two", "raises"]


class MisbehavingDrafter:
    """The real tiny drafter behind a servicer that corrupts its replies in ``mode``."""

    def __init__(self, drafter, mode: str):
        self.drafter, self.mode, self.calls = drafter, mode, 0

    async def GetInfo(self, request, context):
        return info_to_pb(self.drafter.info)

    async def Propose(self, request, context):
        self.calls += 1
        from tandem.pb_convert import draft_to_pb, sampling_from_pb

        if self.mode == "invalid_argument":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "drafter says no")
        if self.mode == "failed_precondition":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not ready")
        if self.mode == "raises":
            raise RuntimeError("drafter bug")
        k = 300 if self.mode == "too_many_tokens" else request.k
        p = self.drafter.propose(request.session_id, request.prefix_length, list(request.appended_tokens), k,
                                 sampling_from_pb(request.sampling))
        tokens = draft_to_pb(p.tokens)
        if self.mode == "id_out_of_vocab":
            tokens[0].token_id = 999_999
        if self.mode == "q_missing":
            for t in tokens:
                del t.support_ids[:], t.support_probs[:]
        if self.mode == "q_zero":
            for t in tokens:
                t.support_probs[list(t.support_ids).index(t.token_id)] = 0.0
        if self.mode == "q_sums_to_two":
            for t in tokens:
                t.support_probs[:] = [2.0 / len(t.support_probs)] * len(t.support_probs)
        return drafter_pb2.Proposal(tokens=tokens, compute_ms=p.compute_ms)

    async def EndSession(self, request, context):
        return common_pb2.EndSessionReply(found=self.drafter.end_session(request.session_id))


def _register(server, servicer, garbage: bool):
    desc = drafter_pb2.DESCRIPTOR.services_by_name["Drafter"]
    from google.protobuf import message_factory

    handlers = {}
    for m in desc.methods:
        if not hasattr(servicer, m.name):       # an RPC this fake does not serve answers UNIMPLEMENTED
            continue
        out = message_factory.GetMessageClass(m.output_type)
        serialize = (lambda msg: b"\xff\xff\xff\xff") if garbage and m.name == "Propose" else out.SerializeToString
        handlers[m.name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, m.name), request_deserializer=message_factory.GetMessageClass(m.input_type).FromString,
            response_serializer=serialize)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(desc.full_name, handlers),))


def _generate(lt, verifier_addr, drafter_addr, req):
    from gateway.engine import GatewayConfig
    from gateway.server import connect_gateway, start_gateway

    gateway = lt.run(connect_gateway(verifier_addr, drafter_addr, GatewayConfig(max_tokens_limit=256)))
    service = lt.run(start_gateway(gateway))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{service.port}") as ch:
            return gateway_grpc.GatewayStub(ch).Generate(req, timeout=60)
    finally:
        lt.run(service.stop(0))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_a_misbehaving_drafter_falls_back_to_the_target_alone(lt, tiny_verifier, tiny_drafter_onnx, mode, sampled):
    """Whatever the drafter does, the request completes with the tokens of target-only decoding, and the
    reply says which node failed."""
    from drafter_service.onnx_drafter import OnnxDrafter

    if not sampled and mode in ("q_missing", "q_zero", "q_sums_to_two"):
        pytest.skip("greedy drafts carry no q")
    target, verifier_addr = tiny_verifier
    sampling = common_pb2.SamplingParams(temperature=0.8, seed=3, has_seed=True) if sampled else None
    req = gateway_pb2.GenerateRequest(prompt="w1 w5 w9", max_tokens=12, ignore_eos=True, draft_length=2,
                                      sampling=sampling)
    bad = MisbehavingDrafter(OnnxDrafter(tiny_drafter_onnx, threads=1), mode)
    service = lt.run(start_service("drafter", lambda s: _register(s, bad, mode == "undecodable"),
                                   ["tandem.v1.Drafter"]))
    try:
        reply = _generate(lt, verifier_addr, f"127.0.0.1:{service.port}", req)
    finally:
        lt.run(service.stop(0))
    plain = gateway_pb2.GenerateRequest(prompt="w1 w5 w9", max_tokens=12, ignore_eos=True, no_speculation=True,
                                        sampling=sampling)
    expected = _generate(lt, verifier_addr, None, plain)
    assert bad.calls >= 1
    assert list(reply.token_ids) == list(expected.token_ids)
    assert "drafter" in reply.stats.fallback_reason, reply.stats.fallback_reason
    assert len(target.sessions) == 0


class LyingDrafter:
    """Proposes token 7 at every position, claiming it drew it with q = 2e-6 (above the checks' floor)."""

    def __init__(self, info):
        self.info, self.calls = info, 0

    async def GetInfo(self, request, context):
        return info_to_pb(self.info)

    async def Propose(self, request, context):
        self.calls += 1
        lie = common_pb2.DraftToken(token_id=7, support_ids=[7], support_probs=[2e-6])
        return drafter_pb2.Proposal(tokens=[lie] * request.k)

    async def EndSession(self, request, context):
        return common_pb2.EndSessionReply(found=True)


def test_a_lying_drafter_cannot_change_seeded_output(lt, tiny_verifier, tiny_drafter_onnx):
    """A drafter that always proposes token 7 and claims q(7) = 2e-6 passes every check of q (a lie cannot be
    told from a rare draw), so its blocks are verified. A seeded request is coupled: the verifier never reads
    q, and the tokens are plain decoding's for the seed. (Rejection sampling would accept token 7 wherever
    the target gives it p >= 2e-6: tests/unit/test_exactness.py shows that bias.)"""
    from drafter_service.onnx_drafter import OnnxDrafter

    target, verifier_addr = tiny_verifier
    sampling = common_pb2.SamplingParams(temperature=1.0, seed=11, has_seed=True)
    liar = LyingDrafter(OnnxDrafter(tiny_drafter_onnx, threads=1).info)
    service = lt.run(start_service("drafter", lambda s: _register(s, liar, False), ["tandem.v1.Drafter"]))
    try:
        reply = _generate(lt, verifier_addr, f"127.0.0.1:{service.port}", gateway_pb2.GenerateRequest(
            prompt="w1 w5 w9", max_tokens=24, ignore_eos=True, draft_length=2, sampling=sampling))
    finally:
        lt.run(service.stop(0))
    plain = _generate(lt, verifier_addr, None, gateway_pb2.GenerateRequest(
        prompt="w1 w5 w9", max_tokens=24, ignore_eos=True, no_speculation=True, sampling=sampling))
    assert list(reply.token_ids) == list(plain.token_ids)
    assert reply.stats.speculative and not reply.stats.fallback_reason and reply.stats.proposed > 0 and liar.calls
    assert list(plain.token_ids).count(7) < 12
    assert len(target.sessions) == 0


# ---- the verifier and the drafter, called directly as an attacker would ---------------------------------
@pytest.fixture(scope="module")
def nodes(lt, tiny_verifier, tiny_drafter_onnx):
    from drafter_service.onnx_drafter import OnnxDrafter
    from drafter_service.server import start_drafter
    from tandem.pb import drafter_grpc, verifier_grpc

    target, verifier_addr = tiny_verifier
    drafter = OnnxDrafter(tiny_drafter_onnx, threads=1)
    dservice = lt.run(start_drafter(drafter))
    channels = [grpc.insecure_channel(verifier_addr), grpc.insecure_channel(f"127.0.0.1:{dservice.port}")]
    yield target, drafter, verifier_grpc.VerifierStub(channels[0]), drafter_grpc.DrafterStub(channels[1])
    for ch in channels:
        ch.close()
    lt.run(dservice.stop(0))


def _code(call, *args, **kw):
    try:
        call(*args, timeout=30, **kw)
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


SAMPLED = common_pb2.SamplingParams(temperature=1.0, seed=5, has_seed=True)


def _start(stub, sid, token="victim-secret", sampling=SAMPLED, timeout=30, **kw):
    from tandem.pb import verifier_pb2

    return stub.StartSession(verifier_pb2.StartSessionRequest(session_id=sid, prompt_ids=[1, 5, 9], sampling=sampling,
                                                              session_token=token, **kw), timeout=timeout)


def test_the_forced_token_attack_is_refused(nodes):
    """A draft token whose q(x) is 0 or 1e-30 would be accepted with probability min(1, p/q) = 1: refused,
    as are probabilities summing to 2 and repeated support ids."""
    from tandem.pb import verifier_pb2

    target, _, vstub, _ = nodes
    _start(vstub, "forced", sampling=common_pb2.SamplingParams(temperature=1.0))   # no seed: rejection sampling
    blocks = {"q(x) = 0": common_pb2.DraftToken(token_id=7, support_ids=[7, 8], support_probs=[0.0, 1.0]),
              "q(x) = 1e-30": common_pb2.DraftToken(token_id=7, support_ids=[7, 8], support_probs=[1e-30, 1.0]),
              "sum 2": common_pb2.DraftToken(token_id=7, support_ids=[7, 8], support_probs=[1.0, 1.0]),
              "duplicates": common_pb2.DraftToken(token_id=7, support_ids=[7, 7], support_probs=[0.5, 0.5]),
              "NaN": common_pb2.DraftToken(token_id=7, support_ids=[7], support_probs=[float("nan")])}
    for name, tok in blocks.items():
        code = _code(vstub.Verify, verifier_pb2.VerifyRequest(session_id="forced", draft=[tok],
                                                              session_token="victim-secret"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, name
    ok = vstub.Verify(verifier_pb2.VerifyRequest(session_id="forced", session_token="victim-secret", draft=[
        common_pb2.DraftToken(token_id=7, support_ids=[7, 8], support_probs=[0.5, 0.5])]), timeout=30)
    assert ok.accepted in (0, 1)
    target.end("forced", "victim-secret")


def test_sessions_cannot_be_hijacked(nodes):
    """Verify into, restart, or end another client's session: refused, and the victim is undisturbed."""
    from tandem.pb import verifier_pb2

    target, drafter, vstub, dstub = nodes
    greedy = common_pb2.SamplingParams()
    first = _start(vstub, "victim", sampling=greedy).first_token
    for token in ("", "guess"):
        assert _code(vstub.Verify, verifier_pb2.VerifyRequest(session_id="victim", session_token=token)) == \
            grpc.StatusCode.PERMISSION_DENIED
        assert _code(vstub.EndSession, common_pb2.EndSessionRequest(session_id="victim", session_token=token)) == \
            grpc.StatusCode.PERMISSION_DENIED
    assert _code(_start, vstub, "victim", token="attacker", sampling=greedy) == grpc.StatusCode.ALREADY_EXISTS
    # the victim's next plain step is the target's own next token
    step = vstub.Verify(verifier_pb2.VerifyRequest(session_id="victim", session_token="victim-secret"), timeout=30)
    _start(vstub, "reference", token="r", sampling=greedy)
    ref_step = vstub.Verify(verifier_pb2.VerifyRequest(session_id="reference", session_token="r"), timeout=30)
    assert first == _start(vstub, "reference2", token="r", sampling=greedy).first_token
    assert step.next_token == ref_step.next_token
    for sid, tok in (("victim", "victim-secret"), ("reference", "r"), ("reference2", "r")):
        assert vstub.EndSession(common_pb2.EndSessionRequest(session_id=sid, session_token=tok), timeout=30).found
    # the drafter likewise
    dstub.Propose(drafter_pb2.ProposeRequest(session_id="d", appended_tokens=[1, 5, 9], k=2,
                                             session_token="victim-secret"), timeout=30)
    assert _code(dstub.Propose, drafter_pb2.ProposeRequest(session_id="d", prefix_length=3, appended_tokens=[4], k=2,
                                                           session_token="guess")) == grpc.StatusCode.PERMISSION_DENIED
    assert _code(dstub.EndSession, common_pb2.EndSessionRequest(session_id="d", session_token="guess")) == \
        grpc.StatusCode.PERMISSION_DENIED
    assert drafter.end_session("d", "victim-secret")


def test_limits_on_every_node_leave_nothing_behind(nodes):
    """Oversized ids, k and blocks are refused with a status and a message; failed calls hold no session."""
    from tandem.pb import verifier_pb2

    target, drafter, vstub, dstub = nodes
    big = "x" * 1_000_000
    assert _code(_start, vstub, big) == grpc.StatusCode.INVALID_ARGUMENT
    assert _code(dstub.Propose, drafter_pb2.ProposeRequest(session_id=big, appended_tokens=[1], k=2)) == \
        grpc.StatusCode.INVALID_ARGUMENT
    assert _code(dstub.Propose, drafter_pb2.ProposeRequest(session_id="k", appended_tokens=[1], k=2000)) == \
        grpc.StatusCode.INVALID_ARGUMENT
    _start(vstub, "blocks", sampling=common_pb2.SamplingParams(), max_draft_length=4)
    block = [common_pb2.DraftToken(token_id=5)] * 5
    assert _code(vstub.Verify, verifier_pb2.VerifyRequest(session_id="blocks", draft=block,
                                                          session_token="victim-secret")) in \
        (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED)
    target.end("blocks", "victim-secret")
    inf = common_pb2.SamplingParams(temperature=float("inf"))
    assert _code(_start, vstub, "inf", sampling=inf) == grpc.StatusCode.INVALID_ARGUMENT
    assert _code(dstub.Propose, drafter_pb2.ProposeRequest(session_id="inf", appended_tokens=[1], k=2,
                                                           sampling=inf)) == grpc.StatusCode.INVALID_ARGUMENT
    assert _code(vstub.Verify, verifier_pb2.VerifyRequest(session_id="nobody")) == grpc.StatusCode.NOT_FOUND
    assert len(target.sessions) == 0 and drafter.session_count() == 0


def test_a_flood_of_sessions_does_not_block_a_generating_client(lt, tiny_verifier, nodes):
    """300 StartSession calls from another caller fill the table; a gateway request still completes."""
    target, _, vstub, _ = nodes
    before = target.sessions.pressure_idle_s
    target.sessions.pressure_idle_s = 0.5            # the default is 5 s; the test need not wait that long
    try:
        import time

        for i in range(300):                     # the table holds 256: the 257th onwards each push out the
            if i == target.sessions.max_sessions:  # longest-idle flood session once it has idled 0.5 s
                time.sleep(0.6)
            _start(vstub, f"flood{i}", token="flood", sampling=common_pb2.SamplingParams())
        assert len(target.sessions) == target.sessions.max_sessions
        time.sleep(0.6)
        reply = _generate(lt, tiny_verifier[1], None, gateway_pb2.GenerateRequest(prompt="w1 w5", max_tokens=8,
                                                                             ignore_eos=True))
        assert len(reply.token_ids) == 8
    finally:
        target.sessions.pressure_idle_s = before
        for sid in list(target.sessions._items):
            target.end(sid)
