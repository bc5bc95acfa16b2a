"""--activations auto (the verifier's default): int8 where most of a GGUF file's layers are 5-bit or K-quant
blocks, fp32 elsewhere; chosen from the file before its weights load, said on the start-up line, and never
overriding a pinned fp32 or int8."""

import pytest

from verifier_service import native
from verifier_service.activation_choice import choose, layer_bytes, settle
from verifier_service.gguf_file import GgufFile

pytestmark = pytest.mark.skipif(native.library() is None, reason="C kernels unavailable")


def tiny(tmp_path, name: str, kinds: dict[str, str], servable: bool = False):
    """A tiny random Llama GGUF of these block types; ``servable``: with the default target's tokenizer (a real
    one, which a Target loads)."""
    from tandem.bench.random_gguf import write
    from tandem.models import resolve

    default = resolve("default") if servable else None
    return write(tmp_path / f"{name}.gguf", arch="llama", hidden=256, heads=4, kv_heads=2, ffn=512, layers=2,
                 kinds=kinds, seed=1, std=0.3,
                 tokenizer_from=default.directory / default.gguf_file if servable else None)


def test_the_rule_counts_the_layers_bytes_by_block_type():
    # Gemma 3 270M Q4_K_M's layers (MB): 64 % Q5_0, the rest Q4_K/Q6_K and a little Q8_0 -> int8
    mode, why = choose({"Q5_0": 43_591_680, "Q4_K": 13_271_040, "Q6_K": 9_676_800, "Q8_0": 1_658_880})
    assert mode == "int8" and "98% of the layers' weights are Q5_0/Q4_K/Q6_K" in why and "--activations fp32" in why
    assert choose({"Q4_1": 90_000_000, "Q8_0": 8_000_000}) == ("fp32", "auto: no 5-bit or K-quant layers")
    assert choose({"Q4_K": 50, "Q8_0": 50})[0] == "fp32"              # half is not most
    assert choose({"Q4_K": 51, "Q8_0": 49})[0] == "int8"
    assert choose({})[0] == "fp32"


def test_the_embedding_and_the_head_do_not_count(tmp_path):
    path = tiny(tmp_path, "q4k-head", {"default": "Q4_1", "token_embd": "Q6_K", "output": "Q6_K"})
    file = GgufFile(path)
    try:
        assert set(layer_bytes(file)) == {"Q4_1"}
    finally:
        file.close()


def test_settle_chooses_only_when_asked_for_auto(tmp_path):
    kquant = GgufFile(tiny(tmp_path, "kquant", {"default": "Q4_K", "ffn_down": "Q6_K", "attn_q": "Q5_0"}))
    legacy = GgufFile(tiny(tmp_path, "legacy", {"default": "Q4_1"}))
    try:
        env = {"TANDEM_ACTIVATIONS": "auto"}
        assert settle(kquant, env).startswith("auto: 100% of the layers' weights are")
        assert env["TANDEM_ACTIVATIONS"] == "int8"
        env = {"TANDEM_ACTIVATIONS": "AUTO"}
        assert settle(legacy, env) == "auto: no 5-bit or K-quant layers"
        assert env["TANDEM_ACTIVATIONS"] == "fp32"
        for pinned in ("fp32", "int8"):                     # a pinned mode is the user's: kept as is
            env = {"TANDEM_ACTIVATIONS": pinned}
            assert settle(kquant, env) == "" and env == {"TANDEM_ACTIVATIONS": pinned}
        env = {}                                            # a library caller that asked nothing: fp32, its default
        assert settle(kquant, env) == "" and env == {}
    finally:
        kquant.close()
        legacy.close()


def test_a_target_loaded_under_auto_runs_the_chosen_arithmetic_and_says_why(tmp_path, monkeypatch):
    from verifier_service.target import Target

    path = tiny(tmp_path, "kquant", {"default": "Q5_0", "attn_output": "Q4_K", "token_embd": "Q8_0"}, servable=True)
    monkeypatch.setenv("TANDEM_ACTIVATIONS", "auto")
    target = Target.load(str(path), widths=(1, 2), warmup=False)
    arithmetic = {m.blocks.activations for m in target.decoder.linears.modules() if hasattr(m, "blocks")}
    assert arithmetic == {"int8"}
    line = target.startup_line()
    assert "int8 activations (llama.cpp's arithmetic; auto: 100% of the layers' weights are Q5_0/Q4_K" in line, line

    monkeypatch.setenv("TANDEM_ACTIVATIONS", "auto")
    legacy = Target.load(str(tiny(tmp_path, "legacy", {"default": "Q4_1"}, servable=True)), widths=(1, 2),
                         warmup=False)
    assert {m.blocks.activations for m in legacy.decoder.linears.modules() if hasattr(m, "blocks")} == {"fp32"}
    assert "fp32 activations (auto: no 5-bit or K-quant layers)" in legacy.startup_line()
