"""Each service's Prometheus endpoint, scraped over HTTP after known requests: counters equal the
replies' statistics."""

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import Stack
from tandem import metrics
from tandem.pb import common_pb2, drafter_pb2, gateway_pb2, verifier_pb2


@pytest.fixture(scope="module")
def stack(tiny_target_dir, tiny_drafter_onnx):
    from drafter_service.onnx_drafter import OnnxDrafter
    from verifier_service.target import Target

    s = Stack(Target.load(str(tiny_target_dir)), OnnxDrafter(tiny_drafter_onnx, threads=1), draft_length=3)
    s.http = {name: metrics.serve(svc.metrics, 0) for name, svc in
              (("gateway", s.gateway_service), ("verifier", s.verifier_service), ("drafter", s.drafter_service))}
    yield s
    for server in s.http.values():
        server.stop()
    s.close()


def scrape(stack, name) -> dict:
    """{sample name: value} and {(sample name, label value...): value} from the real HTTP endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.http[name].port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, *sorted(s.labels.items())) if s.labels else s.name
            out[key] = s.value
    return out


def test_counters_equal_the_replies_statistics(stack):
    before = {name: scrape(stack, name) for name in stack.http}
    sampled = common_pb2.SamplingParams(temperature=0.9, top_p=0.95, seed=3, has_seed=True)
    requests = [gateway_pb2.GenerateRequest(prompt="w1 w5 w9 w20", max_tokens=20, ignore_eos=True, draft_length=3),
                gateway_pb2.GenerateRequest(prompt="w2 w3", max_tokens=12, ignore_eos=True, sampling=sampled),
                gateway_pb2.GenerateRequest(prompt="w4", max_tokens=5, ignore_eos=True, no_speculation=True)]
    replies = [stack.gateway_stub.Generate(r, timeout=60) for r in requests]
    rounds = [r for reply in replies for r in reply.stats.round_stats]
    drafts = sum(1 for r in rounds if r.proposed)
    proposed = sum(r.proposed for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    assert drafts > 0 and proposed == sum(rep.stats.proposed for rep in replies)
    per_pos = [0] * 3
    for rep in replies:
        for i, n in enumerate(rep.stats.accepted_per_position):
            per_pos[i] += n
    after = {name: scrape(stack, name) for name in stack.http}

    def delta(service, key):
        return after[service].get(key, 0.0) - before[service].get(key, 0.0)

    spec = {"tandem:spec_decode_num_drafts_total": drafts, "tandem:spec_decode_num_draft_tokens_total": proposed,
            "tandem:spec_decode_num_accepted_tokens_total": accepted}
    for service in ("gateway", "verifier"):
        for key, want in spec.items():
            assert delta(service, key) == want, (service, key)
        for i, want in enumerate(per_pos):
            key = ("tandem:spec_decode_num_accepted_tokens_per_pos_total", ("position", str(i)))
            assert delta(service, key) == want, (service, key)
    # the drafter counts what it drafted: every token the rounds took from it, and those it drafted ahead that a
    # rejection made useless
    from_drafter = sum(r.proposed for r in rounds if r.source in ("ahead", "wait", "propose"))
    assert from_drafter > 0 and delta("drafter", "tandem:spec_decode_num_draft_tokens_total") >= from_drafter
    assert delta("drafter", "tandem:spec_decode_num_drafts_total") > 0
    assert "tandem:spec_decode_num_accepted_tokens_total" not in after["drafter"]   # it cannot know

    # Latency histograms: one TTFT per request, one inter-token latency per round.
    g = "gateway"
    assert delta(g, "tandem:time_to_first_token_seconds_count") == len(replies)
    assert delta(g, "tandem:inter_token_latency_seconds_count") == len(rounds)
    assert delta(g, "tandem:inter_token_latency_seconds_sum") == pytest.approx(
        sum(r.round_ms for r in rounds) / 1e3, rel=1e-6)
    assert delta(g, "tandem:round_overhead_seconds_count") == len(rounds)
    assert delta(g, "tandem:e2e_request_latency_seconds_count") == len(replies)
    assert delta(g, ("tandem:request_success_total", ("finish_reason", "length"))) == len(replies)
    assert delta(g, "tandem:generation_tokens_total") == sum(rep.stats.new_tokens for rep in replies)
    assert delta(g, "tandem:prompt_tokens_total") == sum(rep.stats.prompt_tokens for rep in replies)
    assert delta(g, "tandem:time_to_first_token_seconds_sum") == pytest.approx(
        sum(rep.stats.ttft_ms for rep in replies) / 1e3, rel=1e-6)
    assert delta("verifier", "tandem:verify_duration_seconds_count") == len(rounds)
    assert delta("verifier", "tandem:verify_duration_seconds_sum") == pytest.approx(
        sum(r.verify_ms for r in rounds) / 1e3, rel=1e-6)
    assert delta("verifier", "tandem:prefill_duration_seconds_count") == len(replies)
    # one draft duration per drafting call (a Propose, or a chunk drafted ahead)
    assert delta("drafter", "tandem:draft_duration_seconds_count") == delta("drafter",
                                                                            "tandem:spec_decode_num_drafts_total")
    assert delta("drafter", "tandem:draft_duration_seconds_sum") > 0

    assert "tandem:kv_cache_bytes" not in after["gateway"]
    for name in stack.http:                         # every session was freed; RSS is reported
        assert after[name]["tandem:active_sessions"] == 0
        assert after[name].get("tandem:kv_cache_bytes", 0) == 0
        assert after[name]["tandem:process_peak_rss_bytes"] > 10 * 2**20
        assert not any(str(k).endswith("_created") for k in after[name])


def test_sessions_and_kv_bytes_while_a_session_is_open(stack):
    reply = stack.verifier_stub.StartSession(verifier_pb2.StartSessionRequest(session_id="m1", prompt_ids=[1, 5, 9]),
                                             timeout=30)
    assert reply.first_token >= 0
    stack.drafter_stub.Propose(drafter_pb2.ProposeRequest(
        session_id="m1", prefix_length=0, appended_tokens=[1, 5, 9], k=2), timeout=30)
    try:
        for name in ("verifier", "drafter"):
            m = scrape(stack, name)
            assert m["tandem:active_sessions"] == 1 and m["tandem:kv_cache_bytes"] > 0, name
    finally:
        stack.verifier_stub.EndSession(common_pb2.EndSessionRequest(session_id="m1"), timeout=10)
        stack.drafter_stub.EndSession(common_pb2.EndSessionRequest(session_id="m1"), timeout=10)
    for name in ("verifier", "drafter"):
        assert scrape(stack, name)["tandem:active_sessions"] == 0
