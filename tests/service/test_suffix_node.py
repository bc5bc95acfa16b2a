"""The model-free drafter node (suffix drafting, no model) over real gRPC with the tiny target: it says it is
model-free, may propose nothing, learns the traffic it serves, and the gateway speculates with it for any
target, greedy output token-identical to plain decoding."""

import grpc
import pytest

from harness import LoopThread, Stack
from tandem.pb import common_pb2, drafter_grpc, drafter_pb2, gateway_pb2
from tiny_models import make_tiny_model

PROMPT = "w1 w5 w9 w20 w5 w9"


def request(**kw):
    kw.setdefault("max_tokens", 32)
    kw.setdefault("ignore_eos", True)
    return gateway_pb2.GenerateRequest(**kw)


def suffix_node(inner=None):
    from drafter_service.suffix_drafter import SuffixDrafter

    return SuffixDrafter(inner)


@pytest.fixture(scope="module")
def stack(tiny_target_dir):
    from verifier_service.target import Target

    s = Stack(Target.load(str(tiny_target_dir)), suffix_node())
    yield s
    s.close()


@pytest.fixture
def node():
    """The model-free node alone (a server of its own: ids sent here must not reach other tests' targets)."""
    from drafter_service.server import start_drafter

    lt = LoopThread()
    service = lt.run(start_drafter(suffix_node()))
    channel = grpc.insecure_channel(f"127.0.0.1:{service.port}")
    yield drafter_grpc.DrafterStub(channel)
    channel.close()
    lt.run(service.stop(0))
    lt.close()


def test_the_node_is_model_free_and_proposes_suffix_copies_or_nothing(node):
    info = node.GetInfo(common_pb2.GetInfoRequest(), timeout=10)
    assert info.model_free and info.vocab_size == 0 and info.vocab_hash == "" and info.model_name == "suffix"
    propose = lambda sid, prefix, tokens, **kw: node.Propose(drafter_pb2.ProposeRequest(  # noqa: E731
        session_id=sid, prefix_length=prefix, appended_tokens=tokens, k=4, session_token="t", **kw), timeout=10)
    assert list(propose("n1", 0, [1, 40000, 41000]).tokens) == []           # nothing seen: an empty block
    reply = propose("n1", 3, [42000, 43000, 1, 40000],
                    sampling=common_pb2.SamplingParams(temperature=1.0))            # unseeded: rejection sampling reads q
    assert [(t.token_id, t.from_lookup, t.origin, list(t.support_ids), list(t.support_probs)) for t in reply.tokens] \
        == [(t, True, "suffix", [t], [1.0]) for t in (41000, 42000)]          # a 2-token match: 2 tokens at most
    with pytest.raises(grpc.RpcError) as err:
        propose("n2", 0, [-5, 3])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_sessions_beside_the_node_trust_their_own_rounds_sooner(stack, tiny_target_dir, tiny_drafter_onnx):
    """Beside the model-free node a session's acceptance starts from the gateway-wide figures at a lighter
    weight than beside a model drafter (gateway/draft_length/acceptance.py)."""
    from drafter_service.onnx_drafter import OnnxDrafter
    from gateway.draft_length import COPYING_PRIOR_WEIGHT, PRIOR_WEIGHT
    from tandem.types import SamplingParams
    from verifier_service.target import Target

    assert stack.gateway.draft_length_policy(0, SamplingParams()).acceptance.prior_weight == COPYING_PRIOR_WEIGHT
    model = Stack(Target.load(str(tiny_target_dir)), OnnxDrafter(tiny_drafter_onnx, threads=1))
    try:
        assert model.gateway.draft_length_policy(0, SamplingParams()).acceptance.prior_weight == PRIOR_WEIGHT
        # blocks of copies already at the gateway may be longer (--max-copy-length) than drafted ones
        drafters = [s.gateway.usable_drafter() for s in (stack, model)]
        follow = [s.gateway.follows_paths(s.lt.run(d)) for s, d in zip((stack, model), drafters)]
        assert follow == [True, False]
        assert [s.gateway.max_block(f) for s, f in zip((stack, model), follow)] == [16, 8]
    finally:
        model.close()


@pytest.mark.parametrize("draft_length", [4, "auto"])
def test_greedy_output_is_plain_decodings_and_repeated_traffic_is_drafted(stack, tiny_target_dir, draft_length):
    """Pinned k and auto: the first request drafts from its own text only, the second one (the same prompt:
    repeated traffic) from the first one's output too, from the node's path drafted ahead of the rounds (never
    waited for: gateway/proposal.py, follow_paths); every output is plain decoding's."""
    from verifier_service.target import Target

    s = stack if draft_length == 4 else Stack(Target.load(str(tiny_target_dir)), suffix_node(), draft_length=0)
    try:
        prompt = f"{PROMPT} w{30 + (draft_length == 4)}"
        plain = s.gateway_stub.Generate(request(prompt=prompt, no_speculation=True), timeout=60)
        first = s.gateway_stub.Generate(request(prompt=prompt), timeout=60)
        again = s.gateway_stub.Generate(request(prompt=prompt), timeout=60)
    finally:
        if s is not stack:
            s.close()
    for reply in (first, again):
        assert list(reply.token_ids) == list(plain.token_ids)
        assert reply.stats.speculative and not reply.stats.fallback_reason and reply.stats.draft_model == "suffix"
    assert again.stats.accepted >= len(plain.token_ids) // 2 and again.stats.rounds < first.stats.rounds
    sources = {r.source for r in again.stats.round_stats if r.proposed}
    assert "ahead" in sources and sources <= {"ahead", "copy"}     # copy: the gateway's own lookup copy
    assert {r.k_reason for r in again.stats.round_stats} <= ({"pinned"} if draft_length == 4 else
                                                             {"best", "probe", "no-figures", "no-budget"})


@pytest.mark.parametrize("node", ["model", "model-free"])
def test_a_target_no_model_drafter_shares_speculates_with_the_model_free_node(tmp_path, tiny_drafter_onnx, node):
    """A target with another vocabulary (80 words, another hash): the model drafter is refused, and the error
    names the model-free node; the model-free node speculates, output identical to plain decoding."""
    from drafter_service.onnx_drafter import OnnxDrafter
    from verifier_service.target import Target

    target = Target.load(str(make_tiny_model(tmp_path / "t80", seed=3, vocab_size=80)))
    s = Stack(target, OnnxDrafter(tiny_drafter_onnx, threads=1) if node == "model" else suffix_node())
    try:
        prompt = "w70 w71 w3 w75 w70 w71"
        plain = s.gateway_stub.Generate(request(prompt=prompt, no_speculation=True), timeout=60)
        if node == "model":
            with pytest.raises(grpc.RpcError) as err:
                s.gateway_stub.Generate(request(prompt=prompt), timeout=30)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "vocabulary" in err.value.details() and "--drafter suffix" in err.value.details()
            return
        for _ in range(2):
            spec = s.gateway_stub.Generate(request(prompt=prompt), timeout=60)
            assert list(spec.token_ids) == list(plain.token_ids) and spec.stats.speculative
        assert spec.stats.accepted > 0 and max(plain.token_ids) >= 64            # ids past the other vocabulary
    finally:
        s.close()


def test_suffix_in_front_of_the_model_keeps_greedy_output(tiny_target_dir, tiny_drafter_onnx):
    from drafter_service.onnx_drafter import OnnxDrafter
    from verifier_service.target import Target

    s = Stack(Target.load(str(tiny_target_dir)), suffix_node(OnnxDrafter(tiny_drafter_onnx, threads=1,
                                                                         lookup_max_ngram=4, lookup_min_ngram=1)))
    try:
        plain = s.gateway_stub.Generate(request(prompt=PROMPT, no_speculation=True), timeout=60)
        for _ in range(2):
            spec = s.gateway_stub.Generate(request(prompt=PROMPT, draft_length=4), timeout=60)
            assert list(spec.token_ids) == list(plain.token_ids) and spec.stats.draft_model.endswith("+suffix")
    finally:
        s.close()


def test_what_the_node_learned_survives_a_restart(tmp_path):
    """``tandem serve-drafter --drafter suffix --suffix-store F``: a session's text served before SIGTERM is
    written to F (owner-only) and drafted from after a restart; a corrupt F stops the start with its line."""
    import os
    import stat

    from procs import ServiceProcess, wait_healthy

    store = tmp_path / "home" / "suffix.jsonl.gz"
    args = ["--drafter", "suffix", "--suffix-store", str(store), "--port", "0"]

    def propose(port, sid, prefix, tokens):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            return [t.token_id for t in drafter_grpc.DrafterStub(channel).Propose(drafter_pb2.ProposeRequest(
                session_id=sid, prefix_length=prefix, appended_tokens=tokens, k=4, session_token="t"),
                timeout=30).tokens]

    first = ServiceProcess("drafter", args, tmp_path, name="first")
    try:
        port = first.wait_port(60)
        wait_healthy(f"127.0.0.1:{port}")
        propose(port, "a", 0, [1, 2, 3, 500, 501, 502, 503, 504, 505])
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            drafter_grpc.DrafterStub(channel).EndSession(common_pb2.EndSessionRequest(session_id="a",
                                                                                      session_token="t"), timeout=10)
    finally:
        first.close(30)
    assert first.proc.returncode == 0, first.tail()
    assert store.exists() and stat.S_IMODE(os.stat(store).st_mode) == 0o600, first.tail()
    second = ServiceProcess("drafter", args, tmp_path, name="second")
    try:
        port = second.wait_port(60)
        wait_healthy(f"127.0.0.1:{port}")
        assert "9 tokens read in" in second.log_path.read_text()
        assert propose(port, "b", 0, [7, 500, 501, 502]) == [503, 504, 505]    # a's text, from the file
    finally:
        second.close(30)
    store.write_bytes(b'{"tokens": [1, 2]}\n{"tokens": "x"}\n')
    broken = ServiceProcess("drafter", args, tmp_path, name="broken")
    try:
        assert broken.proc.wait(60) != 0
        assert f"suffix file {store} line 2" in broken.tail(), broken.tail()
    finally:
        broken.close()
