"""The three services over real gRPC on loopback, with tiny models: behaviour a client relies on."""

import time
import grpc

import pytest

from tandem.pb import common_pb2, drafter_pb2, gateway_pb2, verifier_pb2
from harness import Stack


@pytest.fixture(scope="module")
def stack(tiny_target_dir, tiny_drafter_onnx):
    from drafter_service.onnx_drafter import OnnxDrafter
    from verifier_service.target import Target

    s = Stack(Target.load(str(tiny_target_dir)), OnnxDrafter(tiny_drafter_onnx, threads=1))
    yield s
    s.close()


def request(**kw):
    kw.setdefault("max_tokens", 24)
    kw.setdefault("ignore_eos", True)
    return gateway_pb2.GenerateRequest(**kw)


def test_greedy_speculative_equals_no_speculation_and_hf_generate(stack):
    import torch

    prompt = "w1 w5 w9 w20"
    spec = stack.gateway_stub.Generate(request(prompt=prompt, draft_length=3), timeout=60)
    plain = stack.gateway_stub.Generate(request(prompt=prompt, no_speculation=True), timeout=60)
    assert spec.stats.speculative and not plain.stats.speculative
    assert spec.stats.proposed > 0 and plain.stats.proposed == 0
    assert list(spec.token_ids) == list(plain.token_ids)
    assert len(spec.token_ids) == 24
    prompt_ids = stack.gateway.tokenizer(prompt)["input_ids"]
    ids = torch.tensor([prompt_ids])
    hf = stack.target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                                     eos_token_id=None, pad_token_id=2)[0, len(prompt_ids):].tolist()
    assert list(spec.token_ids) == hf
    # statistics are consistent with the tokens
    st = spec.stats
    assert st.new_tokens == 24 and st.rounds == len(st.round_stats)
    assert st.accepted == sum(r.accepted for r in st.round_stats)
    assert st.mean_acceptance_length == pytest.approx(1 + st.accepted / st.rounds)
    assert plain.stats.mean_acceptance_length == 1.0


def test_stream_yields_the_same_tokens_as_unary(stack):
    req = request(prompt="w3 w4", draft_length=2, max_tokens=16)
    unary = stack.gateway_stub.Generate(req, timeout=60)
    chunks = list(stack.gateway_stub.GenerateStream(req, timeout=60))
    streamed = [t for c in chunks for t in c.token_ids]
    assert streamed == list(unary.token_ids)
    assert "".join(c.text for c in chunks) == unary.text
    assert chunks[-1].finish_reason == "length" and chunks[-1].stats.new_tokens == 16


def test_sampled_generation_is_reproducible_with_a_seed(stack):
    sampling = common_pb2.SamplingParams(temperature=0.8, top_p=0.9, seed=7, has_seed=True)
    a = stack.gateway_stub.Generate(request(prompt="w2 w3", sampling=sampling), timeout=60)
    b = stack.gateway_stub.Generate(request(prompt="w2 w3", sampling=sampling), timeout=60)
    assert list(a.token_ids) == list(b.token_ids) and a.stats.proposed > 0


def test_adaptive_draft_length_keeps_the_output_and_shortens_unsure_blocks(stack):
    """draft_confidence: the drafter ends blocks early (the tiny random drafter is never 90 % sure, so
    every block is one token); 0 drafts exactly draft_length; the tokens are the target's either way."""
    prompt = "w1 w5 w9 w20"
    fixed = stack.gateway_stub.Generate(request(prompt=prompt, draft_length=4, draft_confidence=0.0), timeout=60)
    adaptive = stack.gateway_stub.Generate(request(prompt=prompt, draft_length=4, draft_confidence=0.9), timeout=60)
    plain = stack.gateway_stub.Generate(request(prompt=prompt, no_speculation=True), timeout=60)
    assert list(fixed.token_ids) == list(adaptive.token_ids) == list(plain.token_ids)
    # k: the most a round may draft (4, less near max_tokens)
    assert all(r.proposed == r.k for r in fixed.stats.round_stats) and fixed.stats.round_stats[0].k == 4
    assert all(r.proposed == min(1, r.k) for r in adaptive.stats.round_stats)
    assert sum(r.k == 4 for r in adaptive.stats.round_stats) > 5
    assert adaptive.stats.proposed == sum(r.proposed for r in adaptive.stats.round_stats)


def test_sessions_are_freed_after_requests(stack):
    stack.gateway_stub.Generate(request(prompt="w1 w2"), timeout=60)
    assert len(stack.target.sessions) == 0
    assert stack.drafter.session_count() == 0


def test_a_request_that_never_called_the_drafter_sends_it_no_end_session(stack, monkeypatch):
    """Only a session the gateway proposed for can exist on the drafter: a request that never drafted (one
    token, or an auto request that stayed plain) does not pay a round trip to the drafter at its end
    (10 ms behind a slow link); one that drafted ends its drafter session: at once with Propose, as its
    DraftAhead stream closes when drafting ahead (the gateway half-closes the stream as the reply goes out)."""
    ended = []
    real = stack.drafter.end_session
    monkeypatch.setattr(stack.drafter, "end_session", lambda *a, **kw: ended.append(a[0]) or real(*a, **kw))
    one = stack.gateway_stub.Generate(request(prompt="w1 w2", max_tokens=1, draft_length=2), timeout=60)
    assert len(one.token_ids) == 1 and one.stats.speculative and not ended
    drafted = stack.gateway_stub.Generate(request(prompt="w1 w2", max_tokens=12, draft_length=2), timeout=60)
    deadline = time.monotonic() + 5.0
    while (ended == [] or stack.drafter.session_count()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert drafted.stats.proposed > 0 and len(ended) == 1
    assert len(stack.target.sessions) == 0 and stack.drafter.session_count() == 0
    # the drafter was pinged at first use: its round trip seeds the cost model until Propose calls are timed
    assert 0.0 < stack.gateway.cost.table()["drafter_ping_ms"] < 1000.0


@pytest.mark.parametrize("req, message", [
    (request(prompt=""), "prompt is empty"),
    (request(prompt="   "), "prompt is empty"),
    (request(prompt=" ".join(["w1"] * 300)), "longer than the target's context"),
    (request(prompt="w1", max_tokens=0), "max_tokens"),
    (request(prompt="w1", max_tokens=100_000), "max_tokens"),
    (request(prompt="w1", sampling=common_pb2.SamplingParams(temperature=-1)), "temperature"),
    (request(prompt="w1", sampling=common_pb2.SamplingParams(temperature=float("inf"))), "temperature"),
    (request(prompt="w1", sampling=common_pb2.SamplingParams(temperature=float("nan"))), "temperature"),
    (request(prompt="w1", sampling=common_pb2.SamplingParams(temperature=1, top_p=1.5)), "top_p"),
    (request(prompt="w1", sampling=common_pb2.SamplingParams(temperature=1, top_p=-0.5)), "top_p"),
    (request(prompt_ids=[1, 999]), "outside the vocabulary"),
    (request(prompt="w1", draft_confidence=1.5), "draft_confidence"),
    (request(prompt="w1", draft_confidence=-0.1), "draft_confidence"),
])
def test_gateway_rejects_bad_input_and_stays_up(stack, req, message):
    with pytest.raises(grpc.RpcError) as err:
        stack.gateway_stub.Generate(req, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()
    ok = stack.gateway_stub.Generate(request(prompt="w1 w2", max_tokens=4), timeout=30)
    assert len(ok.token_ids) == 4


def start(stack, sid, sampling=None):
    stack.verifier_stub.StartSession(verifier_pb2.StartSessionRequest(
        session_id=sid, prompt_ids=[1, 5, 6], sampling=sampling or common_pb2.SamplingParams()), timeout=30)


@pytest.mark.parametrize("draft, message", [
    ([common_pb2.DraftToken(token_id=64)], "outside the vocabulary"),
    ([common_pb2.DraftToken(token_id=-1)], "outside the vocabulary"),
    ([common_pb2.DraftToken(token_id=5, support_ids=[5, 6], support_probs=[0.5])], "probabilities"),
    ([common_pb2.DraftToken(token_id=5, support_ids=[5], support_probs=[1.5])], "[0, 1]"),
])
def test_verifier_rejects_bad_draft_blocks(stack, draft, message):
    start(stack, "bad-draft")
    try:
        with pytest.raises(grpc.RpcError) as err:
            stack.verifier_stub.Verify(verifier_pb2.VerifyRequest(session_id="bad-draft", draft=draft), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in err.value.details()
        # the session survives a bad call
        ok = stack.verifier_stub.Verify(verifier_pb2.VerifyRequest(session_id="bad-draft"), timeout=30)
        assert ok.accepted == 0
    finally:
        stack.verifier_stub.EndSession(common_pb2.EndSessionRequest(session_id="bad-draft"), timeout=30)


def test_sampled_session_needs_draft_distribution(stack):
    start(stack, "sampled", common_pb2.SamplingParams(temperature=1.0))
    with pytest.raises(grpc.RpcError) as err:
        stack.verifier_stub.Verify(verifier_pb2.VerifyRequest(
            session_id="sampled", draft=[common_pb2.DraftToken(token_id=5)]), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "draft distribution" in err.value.details()
    stack.verifier_stub.EndSession(common_pb2.EndSessionRequest(session_id="sampled"), timeout=30)


def test_unknown_session_is_not_found_on_both_nodes(stack):
    """One UnknownSession error, one status code: NOT_FOUND, the message naming the node."""
    with pytest.raises(grpc.RpcError) as err:
        stack.verifier_stub.Verify(verifier_pb2.VerifyRequest(session_id="nope"), timeout=30)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "unknown verifier session" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        stack.drafter_stub.Propose(drafter_pb2.ProposeRequest(session_id="nope", prefix_length=5, k=2), timeout=30)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "drafter session" in err.value.details()


def test_drafter_rejects_bad_proposals(stack):
    for req, message in [(drafter_pb2.ProposeRequest(session_id="d", appended_tokens=[1, 2], k=0), "k"),
                         (drafter_pb2.ProposeRequest(session_id="d", appended_tokens=[1, 70], k=2), "vocab")]:
        with pytest.raises(grpc.RpcError) as err:
            stack.drafter_stub.Propose(req, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, message


def test_incompatible_drafter_is_refused(tiny_target_dir, tmp_path, tiny_drafter_onnx):
    """A drafter whose vocabulary differs from the target's: speculation is refused with a clear error."""
    import json
    import shutil

    from drafter_service.onnx_drafter import OnnxDrafter
    from verifier_service.target import Target

    other = tmp_path / "other"
    shutil.copytree(tiny_drafter_onnx, other)
    meta = json.loads((other / "drafter.json").read_text())
    meta["vocab_hash"] = "sha256:" + "0" * 64
    (other / "drafter.json").write_text(json.dumps(meta))
    s = Stack(Target.load(str(tiny_target_dir)), OnnxDrafter(other, threads=1))
    try:
        with pytest.raises(grpc.RpcError) as err:
            s.gateway_stub.Generate(request(prompt="w1 w2"), timeout=30)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "vocabulary" in err.value.details()
        plain = s.gateway_stub.Generate(request(prompt="w1 w2", no_speculation=True, max_tokens=4), timeout=30)
        assert len(plain.token_ids) == 4
    finally:
        s.close()


def test_auto_draft_length_reports_its_choice_and_costs(stack):
    """draft_length 0 = auto: every round says which k it chose and why; the gateway's status and metrics
    show the cost table and acceptance it chose from; the tokens are the target's."""
    prompt = "w1 w5 w9 w20"
    stack.gateway.config.draft_length = 0               # this stack's gateway pins 4 by default
    try:
        auto = stack.gateway_stub.Generate(request(prompt=prompt, draft_length=0, max_tokens=32), timeout=60)
    finally:
        stack.gateway.config.draft_length = 4
    plain = stack.gateway_stub.Generate(request(prompt=prompt, no_speculation=True, max_tokens=32), timeout=60)
    assert list(auto.token_ids) == list(plain.token_ids)
    reasons = {r.k_reason for r in auto.stats.round_stats}
    assert reasons <= {"best", "probe", "no-figures", "no-budget"} and "best" in reasons, reasons
    assert all(r.k <= 8 for r in auto.stats.round_stats)
    from tandem.pb import gateway_pb2 as gpb

    status = stack.gateway_stub.GetStatus(gpb.GetStatusRequest(), timeout=10)
    assert status.cost_model["rounds_observed"] > 0 and status.cost_model["verify_ms_w0"] > 0
    assert 0.0 <= status.acceptance_greedy["a1"] <= 1.0
    text = stack.gateway.metrics.text()
    assert 'tandem:draft_cost{figure="verify_ms_w0"}' in text and "tandem:draft_length_chosen_total" in text


@pytest.fixture(scope="module")
def lookup_stack(tiny_target_dir, tiny_drafter_onnx):
    from drafter_service.lookup_drafter import LookupDrafter
    from drafter_service.onnx_drafter import OnnxDrafter
    from verifier_service.target import Target

    s = Stack(Target.load(str(tiny_target_dir)), LookupDrafter(OnnxDrafter(tiny_drafter_onnx, threads=1),
                                                                max_ngram=4, min_ngram=1))
    yield s
    s.close()


def test_gateway_copies_a_block_prompt_lookup_supplies_whole_without_calling_the_drafter(lookup_stack):
    """Local lookup: the drafter reports its lookup rule; a round whose whole block that rule copies from
    the sequence is proposed by the gateway (no Propose call, no draft time, every token marked lookup);
    output stays the target's, and with local lookup off the drafter is asked for every block."""
    stack = lookup_stack
    info = stack.drafter_stub.GetInfo(common_pb2.GetInfoRequest(), timeout=10)
    assert (info.lookup.max_ngram, info.lookup.min_ngram, info.lookup.trust_ngram) == (4, 1, 1)
    proposes = lambda: stack.drafter_service.metrics.registry.get_sample_value(        # noqa: E731
        "tandem:draft_duration_seconds_count") or 0.0
    prompt = "w1 w2 w3 w4 w5 w1 w2 w3 w4 w5 w1 w2 w3 w4 w5 w1 w2"
    plain = stack.gateway_stub.Generate(request(prompt=prompt, no_speculation=True, max_tokens=48), timeout=60)
    runs = {}
    for local in (True, False):
        stack.gateway.config.local_lookup = local
        try:
            before = proposes()
            reply = stack.gateway_stub.Generate(request(prompt=prompt, draft_length=2, max_tokens=48), timeout=60)
            runs[local] = (reply, proposes() - before)
        finally:
            stack.gateway.config.local_lookup = True
        assert list(reply.token_ids) == list(plain.token_ids)
    (on, on_calls), (off, off_calls) = runs[True], runs[False]
    drafted = lambda r: [s for s in r.stats.round_stats if s.proposed > 0]               # noqa: E731
    copied = [s for s in drafted(on) if s.source == "copy"]
    assert copied, "no round was copied by the gateway"
    assert all(s.lookup_tokens == s.proposed and s.draft_ms == 0.0 for s in copied)
    # every other drafted round's block came from the drafter (drafted ahead, or waited for)
    assert {s.source for s in drafted(on)} - {"copy"} <= {"ahead", "wait"} and on_calls > 0
    assert not any(s.source == "copy" for s in drafted(off)) and off_calls > 0   # off: the drafter drafts every block


def test_lookup_only_speculates_with_gateway_copies_and_never_calls_the_drafter(stack):
    """--lookup-only: no drafter node; blocks prompt lookup supplies are copied by the gateway, every other round
    is a plain step; the output is the target's."""
    prompt = "w1 w2 w3 w4 w5 w1 w2 w3 w4 w5 w1 w2 w3 w4 w5 w1 w2"
    plain = stack.gateway_stub.Generate(request(prompt=prompt, no_speculation=True, max_tokens=40), timeout=60)
    sessions_before = stack.drafter.session_count()
    stack.gateway.config.lookup_only = True
    try:
        reply = stack.gateway_stub.Generate(request(prompt=prompt, max_tokens=40), timeout=60)
        during = stack.drafter.session_count()
    finally:
        stack.gateway.config.lookup_only = False
    assert list(reply.token_ids) == list(plain.token_ids)
    assert reply.stats.speculative and reply.stats.draft_model == "prompt lookup (gateway)"
    rounds = reply.stats.round_stats
    assert {r.source for r in rounds} <= {"copy", ""} and any(r.source == "copy" for r in rounds)
    assert all(r.lookup_tokens == r.proposed for r in rounds) and reply.stats.accepted > 0
    assert during == sessions_before == 0
