"""The greedy head served: a verifier process with ``--greedy-head on`` answers greedy chat requests through a
gateway and the `openai` client with the same text as one with ``--greedy-head off``, its start-up line says
which it runs, and its Prometheus counters say how many rows of logits took the bound pass and how many head
rows those needed computed exactly."""

from __future__ import annotations

import urllib.request

import pytest
from procs import ServiceProcess, free_port

from verifier_service import native

pytestmark = pytest.mark.skipif(native.library() is None, reason="C kernels unavailable")


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    """A tiny served Llama (the default target's tokenizer and its 49 152-token vocabulary) with a Q8_0 head."""
    from tandem.bench.random_gguf import write
    from tandem.models import resolve

    default = resolve("default")
    return write(tmp_path_factory.mktemp("greedy") / "tiny.gguf", arch="llama", hidden=128, heads=2, kv_heads=1,
                 ffn=256, std=0.3, kinds={"default": "Q4_1", "output": "Q8_0"}, seed=5,
                 tokenizer_from=default.directory / default.gguf_file)


def counters(metrics_port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30).read().decode()
    return {name: float(line.split()[-1]) for line in text.splitlines()
            for name in ("tandem:greedy_head_rows_total", "tandem:greedy_head_candidates_total")
            if line.startswith(name + " ")}


def answers(client) -> list[str]:
    out = []
    for question in ("Name three rivers of Europe.", "Write a haiku about autumn."):
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": question}],
                                               max_tokens=24, temperature=0)
        out.append(reply.choices[0].message.content)
    return out


def test_greedy_rows_from_the_bound_pass_give_the_same_text(tiny_file, tmp_path):
    import openai

    common = ["--target", str(tiny_file), "--no-warmup", "--threads", "1", "--port", "0"]
    ports = {"on": free_port(), "off": free_port()}
    verifiers = {mode: ServiceProcess("verifier", [*common, "--greedy-head", mode, "--metrics-port", str(ports[mode])],
                                      tmp_path, name=f"greedy-{mode}") for mode in ("on", "off")}
    gateways = {}
    try:
        for mode, verifier in verifiers.items():
            http = free_port()
            gateways[mode] = (http, ServiceProcess("gateway", [
                "--verifier", f"127.0.0.1:{verifier.wait_port(120)}", "--drafter", "", "--port", "0",
                "--http-port", str(http)], tmp_path, name=f"gw-{mode}"))
        for _, gw in gateways.values():
            gw.wait_port(120)
        assert "greedy head argmax-only rows at widths 1-8 (--greedy-head on)" in verifiers["on"].log_path.read_text()
        assert "greedy head off (--greedy-head off)" in verifiers["off"].log_path.read_text()
        clients = {mode: openai.OpenAI(base_url=f"http://127.0.0.1:{http}/v1", api_key="x", timeout=120)
                   for mode, (http, _) in gateways.items()}
        assert answers(clients["on"]) == answers(clients["off"])
        on, off = counters(ports["on"]), counters(ports["off"])
        assert on["tandem:greedy_head_rows_total"] >= 40              # every plain step of both answers
        assert 1 <= on["tandem:greedy_head_candidates_total"] / on["tandem:greedy_head_rows_total"] < 1000
        assert off["tandem:greedy_head_rows_total"] == 0
    finally:
        for _, gw in gateways.values():
            gw.close()
        for verifier in verifiers.values():
            verifier.close()
