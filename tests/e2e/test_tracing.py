"""One request = one distributed trace across three processes, exported over OTLP/gRPC to a real
receiver in this test (opentelemetry-proto's TraceService)."""

from collections import defaultdict

import grpc
import pytest

from procs import OtlpReceiver, Services
from tandem.pb import gateway_grpc, gateway_pb2

SERVER = 2  # opentelemetry.proto.trace.v1.Span.SPAN_KIND_SERVER


@pytest.fixture(scope="module")
def traced(tiny_target_dir, tiny_drafter_onnx):
    """(reply, spans): one request through three traced processes, stopped (flushed) afterwards."""
    receiver = OtlpReceiver()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100",
           "OTEL_TRACES_SAMPLER": "parentbased_always_on"}
    try:
        services = Services(tiny_target_dir, tiny_drafter_onnx, env=env, draft_length=3)
        try:
            with grpc.insecure_channel(services.gateway_address) as channel:
                reply = gateway_grpc.GatewayStub(channel).Generate(
                    gateway_pb2.GenerateRequest(prompt="w1 w5 w9 w20", max_tokens=16, ignore_eos=True,
                                                draft_length=3), timeout=120)
        finally:
            codes = services.stop()
        assert codes == {"verifier": 0, "drafter": 0, "gateway": 0}, codes
        yield reply, receiver.snapshot()          # SIGTERM flushed every batch before the exit
    finally:
        receiver.stop()


def _tree(spans):
    by_id = {s["span_id"]: s for s in spans}

    def ancestors(span):
        while span["parent_id"] in by_id:
            span = by_id[span["parent_id"]]
            yield span

    return by_id, ancestors


def test_one_request_is_one_trace_across_three_services(traced):
    reply, spans = traced
    generate = [s for s in spans if s["kind"] == SERVER and s["name"].endswith("Gateway/Generate")]
    assert len(generate) == 1
    trace_id = generate[0]["trace_id"]
    request_spans = [s for s in spans if s["trace_id"] == trace_id]
    # The only other traces are the gateway's start-up handshake (GetInfo to verifier and drafter).
    others = {s["name"] for s in spans if s["trace_id"] != trace_id}
    assert all(name.endswith("/GetInfo") for name in others), others
    assert {s["service"] for s in request_spans} == {"tandem-gateway", "tandem-verifier", "tandem-drafter"}
    # Every span of the request hangs off the Generate server span (no orphans, no second root).
    by_id, ancestors = _tree(request_spans)
    for s in request_spans:
        if s is not generate[0]:
            assert generate[0] in list(ancestors(s)), s["name"]


def test_server_spans_nest_under_round_spans_and_add_up_to_the_stats(traced):
    reply, spans = traced
    st = reply.stats
    assert st.speculative and st.rounds > 0 and st.proposed > 0
    trace_id = next(s["trace_id"] for s in spans if s["name"].endswith("Gateway/Generate"))
    spans = [s for s in spans if s["trace_id"] == trace_id]
    by_id, ancestors = _tree(spans)
    names = defaultdict(list)
    for s in spans:
        names[(s["service"], s["name"])].append(s)

    # The request span: GenAI semantic conventions + tandem.* figures.
    (request,) = [s for s in spans if s["name"].startswith("text_completion ")]
    a = request["attributes"]
    assert a["gen_ai.operation.name"] == "text_completion"
    assert a["gen_ai.request.model"] == st.target_model
    assert a["gen_ai.usage.input_tokens"] == st.prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == st.new_tokens == 16
    assert a["tandem.k"] == 3 and a["tandem.draft_model"] == st.draft_model
    assert a["tandem.mean_acceptance_length"] == pytest.approx(st.mean_acceptance_length)
    assert a["tandem.ttft_ms"] == pytest.approx(st.ttft_ms)

    # Round spans: one per round, attributes equal to the reply's round statistics.
    rounds = sorted(names[("tandem-gateway", "round")], key=lambda s: s["attributes"]["tandem.round.index"])
    assert len(rounds) == st.rounds == len(st.round_stats)
    assert sum(r["attributes"]["tandem.round.accepted"] for r in rounds) == st.accepted
    assert sum(r["attributes"]["tandem.round.proposed"] for r in rounds) == st.proposed
    for span, rs in zip(rounds, st.round_stats):
        ra = span["attributes"]
        assert span["parent_id"] == request["span_id"]
        assert (ra["tandem.round.index"], ra["tandem.round.k"], ra["tandem.round.accepted"],
                ra["tandem.round.rejection_position"], ra["tandem.round.bonus"]) == (
                    rs.index, rs.k, rs.accepted, rs.rejection_position, rs.bonus)
        assert ra["tandem.round.draft_ms"] == pytest.approx(rs.draft_ms)
        assert ra["tandem.round.verify_ms"] == pytest.approx(rs.verify_ms)
        assert ra["tandem.round.overhead_ms"] == pytest.approx(rs.overhead_ms)
    (prefill,) = names[("tandem-gateway", "prefill")]
    assert prefill["parent_id"] == request["span_id"]

    # The verifier's server spans have a round span as ancestor, one per round. The drafter drafts ahead on one
    # DraftAhead stream per request (its server span under the request), one "draft" span per chunk it drafted;
    # a block prompt lookup supplies whole is copied by the gateway (draft_ms 0, every token a lookup token).
    round_ids = {r["span_id"] for r in rounds}
    verify = [s for s in spans if s["kind"] == SERVER and s["name"].endswith("Verifier/Verify")]
    assert {s["service"] for s in verify} == {"tandem-verifier"} and len(verify) == st.rounds
    for s in verify:
        assert round_ids & {a["span_id"] for a in ancestors(s)}, s["name"]
    for span, rs in zip(rounds, st.round_stats):
        assert span["attributes"]["tandem.round.source"] == rs.source
    copied = [r for r in st.round_stats if r.source == "copy"]
    assert all(r.lookup_tokens == r.proposed and r.draft_ms == 0 for r in copied)
    from_drafter = sum(r.proposed for r in st.round_stats if r.source in ("ahead", "wait"))
    assert from_drafter > 0
    (ahead,) = [s for s in spans if s["kind"] == SERVER and s["name"].endswith("Drafter/DraftAhead")]
    assert ahead["service"] == "tandem-drafter" and prefill in list(ancestors(ahead))   # it reads the prompt then
    (start,) = [s for s in spans if s["kind"] == SERVER and s["name"].endswith("Verifier/StartSession")]
    assert prefill in list(ancestors(start))

    # Each server's own compute spans sit under its server span.
    server_of = lambda s: by_id[s["parent_id"]]["name"]  # noqa: E731
    drafts = names[("tandem-drafter", "draft")]
    assert drafts and all(server_of(s).endswith("Drafter/DraftAhead") for s in drafts)
    assert sum(s["attributes"]["tandem.k"] for s in drafts) >= from_drafter
    forwards = names[("tandem-verifier", "target.forward")]
    assert len(forwards) == st.rounds + 1          # the prefill's and one per round
    assert all(server_of(s).endswith(("Verifier/Verify", "Verifier/StartSession")) for s in forwards)
    acceptance = names[("tandem-verifier", "acceptance")]
    assert len(acceptance) == st.rounds and all(server_of(s).endswith("Verifier/Verify") for s in acceptance)
    assert sum(s["attributes"]["tandem.accepted"] for s in acceptance) == st.accepted
