"""A chat's next turn through the OpenAI API, the `openai` client and a gateway reaching a verifier process
over gRPC with --activations int8: the verifier's prefix cache serves the conversation's earlier turns (its
Prometheus counters say how many prompt tokens), the answer is the one a verifier without the cache gives,
and a request with another ``cache_salt`` takes nothing from it."""

from __future__ import annotations

import urllib.request

import pytest
from procs import ServiceProcess, free_port

from tiny_models import tiny_served_gguf
from verifier_service import native

pytestmark = pytest.mark.skipif(native.library() is None or native.isa() not in native.X8_ISAS,
                                reason="no x8 int8 kernels on this path")


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    return tiny_served_gguf(tmp_path_factory.mktemp("prefix") / "tiny.gguf")


def reused_tokens(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30).read().decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("tandem:prefix_cache_reused_tokens_total"))
    return float(line.split()[-1])


def conversation(client, salt: str | None) -> list[str]:
    """Two turns of one chat; the second resends the first with its answer."""
    messages = [{"role": "system", "content": "You are a terse assistant. " * 4},
                {"role": "user", "content": "Name three rivers of Europe."}]
    extra = {"cache_salt": salt} if salt is not None else {}
    answers = []
    for follow_up in ("And three in Asia?", None):
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0,
                                               extra_body={"no_speculation": True, **extra})
        answers.append(reply.choices[0].message.content)
        if follow_up is None:
            break
        messages += [{"role": "assistant", "content": answers[-1]}, {"role": "user", "content": follow_up}]
    return answers


def test_a_next_turn_is_served_from_the_prefix_cache_with_the_same_answer(tiny_file, tmp_path):
    import openai

    common = ["--target", str(tiny_file), "--no-warmup", "--threads", "1", "--activations", "int8", "--port", "0"]
    metrics = free_port()
    cached = ServiceProcess("verifier", [*common, "--metrics-port", str(metrics)], tmp_path, name="cached")
    plain = ServiceProcess("verifier", [*common, "--prefix-cache-mb", "0"], tmp_path, name="nocache")
    gateways = []
    try:
        for verifier in (cached, plain):
            http = free_port()
            gateways.append((http, ServiceProcess("gateway", [
                "--verifier", f"127.0.0.1:{verifier.wait_port(120)}", "--drafter", "", "--port", "0",
                "--http-port", str(http)], tmp_path, name=f"gw-{verifier.name}")))
        for _, gw in gateways:
            gw.wait_port(120)
        assert "prefix cache of 256 MiB" in cached.log_path.read_text(), cached.tail()
        assert "no prefix cache" in plain.log_path.read_text(), plain.tail()
        with_cache, without = (openai.OpenAI(base_url=f"http://127.0.0.1:{http}/v1", api_key="x", timeout=120)
                               for http, _ in gateways)

        want = conversation(without, None)
        assert conversation(with_cache, None) == want
        first = reused_tokens(metrics)
        assert first > 20                          # the second turn took the first turn's prompt and answer
        assert conversation(with_cache, "other household member") == want
        after_other = reused_tokens(metrics)
        # another salt: its first turn found nothing (only its own second turn reused its first)
        assert 0 < after_other - first < first + 20
        assert conversation(with_cache, None) == want      # back in the shared scope: the whole first turn
        assert reused_tokens(metrics) - after_other > first
    finally:
        for _, gw in gateways:
            gw.close()
        cached.close()
        plain.close()
