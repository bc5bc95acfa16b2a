"""GEMMs on GGUF blocks as stored (verifier_service.gguf_linear over quant.QuantWeight): the weights are bit for bit
the ones transformers dequantizes, results match F.linear to fp32 rounding, and a row's result never depends
on the block width or the thread count.

A tiny random Llama is quantized with gguf-py (Q4_1 layers, a Q8_0 head) into a real GGUF file; the model's
weights are then set to the dequantized values, as transformers would load them from that file."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from verifier_service import gguf_linear, native

pytestmark = pytest.mark.skipif(native.library() is None,
                                reason=f"GGUF kernel unavailable: {native.unavailable_reason()}")

PARTS = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
         "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def quantize(weight: torch.Tensor, kind) -> tuple[np.ndarray, torch.Tensor]:
    """(the GGUF blocks [out, bytes], the fp32 weight they dequantize to) of ``weight``."""
    import gguf

    blocks = gguf.quants.quantize(weight.detach().numpy().astype(np.float32), kind)
    return blocks, torch.from_numpy(gguf.quants.dequantize(blocks, kind).astype(np.float32)).reshape(weight.shape)


@pytest.fixture(scope="module")
def gguf_model(tiny_target_dir, tmp_path_factory):
    """(model with GGUF-exact weights, tokenizer, path of the GGUF file). attn_q's rows are stored shuffled in
    the file, as a loader that permutes rows would see them: the kernel must find the permutation."""
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_target_dir)
    path = tmp_path_factory.mktemp("gguf") / "tiny.Q4_1.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            for attr, name in PARTS.items():
                linear = getattr(layer.self_attn, attr, None) or getattr(layer.mlp, attr)
                blocks, values = quantize(linear.weight, gguf.GGMLQuantizationType.Q4_1)
                linear.weight.copy_(values)
                if name == "attn_q":
                    order = rng.permutation(blocks.shape[0])
                    linear.weight.copy_(values[order])       # model row r = file row order[r]
                writer.add_tensor(f"blk.{i}.{name}.weight", blocks, raw_dtype=gguf.GGMLQuantizationType.Q4_1)
        blocks, values = quantize(model.lm_head.weight, gguf.GGMLQuantizationType.Q8_0)
        model.lm_head.weight.copy_(values)
        writer.add_tensor("output.weight", blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, tokenizer, path


def test_blocks_are_the_models_weights_and_rows_are_recovered(gguf_model):
    model, _, path = gguf_model
    weights = gguf_linear.GgufWeights(path)
    layer = model.model.layers[0]
    for attr in ("q_proj", "k_proj", "down_proj"):
        linear = getattr(layer.self_attn, attr, None) or getattr(layer.mlp, attr)
        packed, why = weights.rows_for(linear.weight, f"blk.0.{PARTS[attr]}.weight")
        assert packed is not None, why
        assert torch.equal(packed.dequantize(), linear.weight)          # bit for bit, q's rows reordered
    head, why = weights.rows_for(model.lm_head.weight, "output.weight")
    assert head is not None and head.kind == gguf_linear.Q8_0, why
    assert head.nbytes < model.lm_head.weight.numel() * 4 / 3
    other, why = weights.rows_for(layer.mlp.up_proj.weight * 1.001, "blk.0.ffn_up.weight")
    assert other is None and "not the model's weight" in why
    missing, why = weights.rows_for(layer.mlp.up_proj.weight, "blk.9.ffn_up.weight")
    assert missing is None and "blk.9.ffn_up.weight" in why


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_kernel_matches_f_linear_and_rows_do_not_depend_on_width_or_threads(kind):
    import gguf

    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(200, 96, generator=gen)
    blocks, values = quantize(weight, getattr(gguf.GGMLQuantizationType, kind))
    packed = gguf_linear.Packed(kind, blocks, 200, 96)
    assert torch.equal(packed.dequantize(), values)
    bias = torch.randn(200, generator=gen)
    linear = gguf_linear.GgufLinear(packed, bias)
    x = torch.randn(19, 96, generator=gen)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        full = linear(x)
        torch.testing.assert_close(full, F.linear(x, values, bias), rtol=1e-5, atol=1e-5)
        for width in (1, 2, 3, 5, 8, 9, 16, 19):
            for i in range(width):
                assert torch.equal(linear(x[:width])[i], full[i]), (width, i)
        torch.set_num_threads(2)
        assert torch.equal(linear(x), full)
        assert torch.equal(linear(x[4:5])[0], full[4])
    finally:
        torch.set_num_threads(before)


def test_wide_inputs_go_to_the_fp32_layer_and_narrow_ones_to_the_blocks():
    """Prefill chunks (more than WIDE_ROWS rows) take the layer's fp32 GEMM (compute-bound, faster there);
    plain steps and verify blocks take the blocks. Both compute the same weights."""
    import gguf

    weight = torch.randn(64, 64, generator=torch.Generator().manual_seed(5))
    blocks, values = quantize(weight, gguf.GGMLQuantizationType.Q4_1)
    fp32 = torch.nn.Linear(64, 64, bias=False)
    with torch.no_grad():
        fp32.weight.copy_(values)
    calls = []
    fp32.register_forward_hook(lambda *a: calls.append(1))
    linear = gguf_linear.GgufLinear(gguf_linear.Packed("Q4_1", blocks, 64, 64), wide=fp32)
    x = torch.randn(gguf_linear.WIDE_ROWS + 8, 64)
    with torch.inference_mode():
        torch.testing.assert_close(linear(x), F.linear(x, values), rtol=1e-5, atol=1e-5)
        assert calls == [1]
        torch.testing.assert_close(linear(x[:gguf_linear.WIDE_ROWS]), F.linear(x[:gguf_linear.WIDE_ROWS], values),
                                   rtol=1e-5, atol=1e-5)
        assert calls == [1]
