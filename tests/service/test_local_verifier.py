"""The verifier in the gateway's process (``serve-gateway --verifier local``, ``tandem up``'s default):
the same text as a gateway reaching a verifier service over gRPC, the verifier's metrics beside the
gateway's, and every error the gateway decides on raised as the domain error its status code would be."""

from __future__ import annotations

import asyncio
import dataclasses
import urllib.request

import httpx
import pytest
from procs import ServiceProcess, free_port

from tiny_models import tiny_served_gguf
from tandem.errors import InvalidInput, NotSessionOwner, PeerFailed, UnknownSession
from tandem.types import DraftToken, SamplingParams
from verifier_service import native

pytestmark = pytest.mark.skipif(native.library() is None, reason="C kernels unavailable")
PROMPTS = ["Write a haiku about autumn.", "What is 12 times 7?", "Name three rivers of Europe."]


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    """A tiny random GGUF with the default target's tokenizer (a real one: the HTTP API applies its template)."""
    return tiny_served_gguf(tmp_path_factory.mktemp("local") / "tiny.gguf")


def completions(http_port: int) -> list[tuple[str, int]]:
    out = []
    with httpx.Client(base_url=f"http://127.0.0.1:{http_port}", timeout=120) as client:
        for prompt in PROMPTS:
            reply = client.post("/v1/chat/completions", json={
                "model": "tiny", "messages": [{"role": "user", "content": prompt}], "max_tokens": 24,
                "temperature": 0, "no_speculation": True})
            assert reply.status_code == 200, reply.text
            body = reply.json()
            out.append((body["choices"][0]["message"]["content"], body["usage"]["completion_tokens"]))
    return out


def test_the_gateway_with_the_target_in_process_answers_as_over_grpc(tiny_file, tmp_path):
    target = ["--target", str(tiny_file), "--no-warmup", "--threads", "1"]
    http_local, http_remote, metrics = free_port(), free_port(), free_port()
    local = ServiceProcess("gateway", ["--verifier", "local", *target, "--drafter", "", "--port", "0",
                                       "--http-port", str(http_local), "--metrics-port", str(metrics)],
                           tmp_path, name="local")
    verifier = ServiceProcess("verifier", [*target, "--port", "0"], tmp_path)
    try:
        remote = ServiceProcess("gateway", ["--verifier", f"127.0.0.1:{verifier.wait_port(120)}", "--drafter", "",
                                            "--port", "0", "--http-port", str(http_remote)], tmp_path, name="remote")
        try:
            local.wait_port(120)
            remote.wait_port(120)
            got = completions(http_local)
            assert got == completions(http_remote)
            assert all(n > 0 for _, n in got)
            text = urllib.request.urlopen(f"http://127.0.0.1:{metrics + 1}/metrics", timeout=10).read().decode()
            count = [line for line in text.splitlines() if line.startswith("tandem:verify_duration_seconds_count")]
            assert count and float(count[0].split()[-1]) > 0, text[:2000]
        finally:
            remote.close()
    finally:
        local.close()
        verifier.close()
    assert "pending rows ahead" in local.log_path.read_text(), local.tail()     # the verifier's start-up line


def test_errors_keep_the_meaning_their_status_code_has(tiny_file, monkeypatch):
    from gateway.local_verifier import LocalVerifier
    from verifier_service.target import Target

    target = Target.load(str(tiny_file), widths=(1,), warmup=False)
    local = LocalVerifier(target)

    async def run():
        first, _ = await local.start("s", [3, 4, 5], SamplingParams(), token="secret")
        assert 0 <= first < target.vocab_size
        with pytest.raises(UnknownSession, match="verifier \\(in this process\\): NOT_FOUND"):
            await local.verify("nobody", [], "secret")
        with pytest.raises(NotSessionOwner):
            await local.verify("s", [], "wrong")
        with pytest.raises(InvalidInput):
            await local.verify("s", [DraftToken(10**6)], "secret")
        monkeypatch.setattr(target, "averify", lambda *a: (_ for _ in ()).throw(ZeroDivisionError("bug")))
        with pytest.raises(PeerFailed, match="request id") as err:
            await local.verify("s", [], "secret")
        assert "ZeroDivisionError" not in str(err.value)
        await local.end("s", "secret")
        assert target.sessions.count() == 0
    asyncio.run(run())


def test_up_runs_the_target_in_the_gateway(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from tandem import up

    spawned = {}

    class Stop(Exception):
        pass

    def spawn(self, name, args, port=0, label=None):
        spawned[name] = list(args)
        if name == "gateway":
            raise Stop

    monkeypatch.setattr(up.Cluster, "spawn", spawn)
    monkeypatch.setattr(up.Cluster, "wait_up", lambda self, names, deadline: self.ports.update(drafter=1))
    monkeypatch.setattr(up.Cluster, "stop", lambda self, *a, **k: None, raising=False)
    with pytest.raises(Stop):
        up.start_cluster(SimpleNamespace(log_dir=str(tmp_path), startup_timeout=5, target="default", drafter="default",
                                         verifier_threads=1, drafter_threads=1, gateway_port=0, draft_length=2,
                                         draft_confidence=0.0, http_port=-1,
                                         activations="int8"))
    assert "verifier" not in spawned
    gateway = spawned["gateway"]
    assert gateway[:8] == ["--verifier", "local", "--target", "default", "--threads", "1", "--activations", "int8"]


def test_the_targets_spans_join_the_gateways_trace(tiny_file, tmp_path):
    """Tracing with the target in the gateway's process: the forward and acceptance spans of each round are
    children of that round's span, in the gateway's trace and service."""
    import grpc
    from procs import OtlpReceiver

    from tandem.pb import gateway_grpc, gateway_pb2

    receiver = OtlpReceiver()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100",
           "OTEL_TRACES_SAMPLER": "parentbased_always_on"}
    gateway = ServiceProcess("gateway", ["--verifier", "local", "--target", str(tiny_file), "--no-warmup",
                                         "--threads", "1", "--drafter", "", "--port", "0"], tmp_path, env=env)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{gateway.wait_port(120)}") as channel:
            reply = gateway_grpc.GatewayStub(channel).Generate(
                gateway_pb2.GenerateRequest(prompt="w1 w5 w9", max_tokens=8, ignore_eos=True), timeout=120)
        gateway.close()                                    # SIGTERM flushes the spans
        spans = receiver.snapshot()
    finally:
        gateway.close()
        receiver.stop()
    (generate,) = [s for s in spans if s["name"].endswith("Gateway/Generate")]
    mine = [s for s in spans if s["trace_id"] == generate["trace_id"]]
    assert {s["service"] for s in mine} == {"tandem-gateway"}
    by_id = {s["span_id"]: s for s in mine}
    rounds = [s for s in mine if s["name"] == "round"]
    forwards = [s for s in mine if s["name"] == "target.forward"]
    assert len(rounds) == reply.stats.rounds > 0
    assert len(forwards) == reply.stats.rounds + 1                           # the prefill's, then one a round
    assert all(by_id[f["parent_id"]]["name"] in ("round", "prefill") for f in forwards)


def test_the_tokenizer_built_before_the_target_is_the_one_the_gateway_uses(tiny_file, tmp_path):
    """With the target in the gateway's process, the tokenizer is parsed before the target loads (its parse's
    memory is then not on top of the target's); the gateway takes that tokenizer only for the same JSON and
    special tokens, and one built for another JSON is dropped, never used."""
    from gateway import engine
    from gateway.local_verifier import LocalVerifier, build_tokenizer_first
    from verifier_service.target import Target

    assert build_tokenizer_first(str(tiny_file))
    assert not build_tokenizer_first(str(tmp_path))           # not a GGUF file: left to the usual order
    (ahead,) = engine._BUILT_AHEAD.values()
    info = asyncio.run(LocalVerifier(Target.load(str(tiny_file), warmup=False)).get_info())
    tok = engine.build_tokenizer(info)
    assert tok is ahead and not engine._BUILT_AHEAD
    assert tok.chat_template == info.chat_template and tok.eos_token == info.eos_token
    fresh = engine.build_tokenizer(info)                      # nothing ahead any more: built from the JSON
    assert fresh is not tok and fresh("Name three rivers.").input_ids == tok("Name three rivers.").input_ids

    assert build_tokenizer_first(str(tiny_file))
    other = dataclasses.replace(info, eos_token=info.bos_token or "<other>")
    assert engine.build_tokenizer(other) is not ahead and not engine._BUILT_AHEAD
