"""Trust nothing on the wire (issue 16): a misbehaving drafter costs speed, never the request; the
verifier refuses a q that cannot be the drafter's; sessions belong to their creator; every node bounds
what it accepts and answers malformed messages with INVALID_ARGUMENT."""

from __future__ import annotations

import grpc
import pytest

from harness import LoopThread
from tandem.convert import info_to_pb
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
        from tandem.convert import draft_to_pb, sampling_from_pb

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
        out = message_factory.GetMessageClass(m.output_type)
        serialize = (lambda msg: b"\xff\xff\xff\xff") if garbage and m.name == "Propose" else out.SerializeToString
        handlers[m.name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, m.name), request_deserializer=message_factory.GetMessageClass(m.input_type).FromString,
            response_serializer=serialize)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(desc.full_name, handlers),))


@pytest.fixture(scope="module")
def lt():
    loop = LoopThread()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def verifier(lt, tiny_target_dir):
    from verifier_service.server import start_verifier
    from verifier_service.target import Target

    target = Target.load(str(tiny_target_dir))
    service = lt.run(start_verifier(target))
    yield target, f"127.0.0.1:{service.port}"
    lt.run(service.stop(0))


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
def test_a_misbehaving_drafter_falls_back_to_the_target_alone(lt, verifier, tiny_drafter_onnx, mode, sampled):
    """Whatever the drafter does, the request completes with the tokens of target-only decoding, and the
    reply says which node failed."""
    from drafter_service.onnx_drafter import OnnxDrafter

    if not sampled and mode in ("q_missing", "q_zero", "q_sums_to_two"):
        pytest.skip("greedy drafts carry no q")
    target, verifier_addr = verifier
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
