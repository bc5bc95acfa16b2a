"""tandem.export: the ONNX file has the standard decoder-with-past layout and matches torch."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

TOL = 1e-3


def _session(path):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _feed(ids, past, layers):
    p, s = past[0].shape[2], ids.shape[1]
    feed = {"input_ids": ids, "attention_mask": np.ones((ids.shape[0], p + s), np.int64),
            "position_ids": np.tile(np.arange(p, p + s, dtype=np.int64), (ids.shape[0], 1))}
    for i in range(layers):
        feed[f"past_key_values.{i}.key"], feed[f"past_key_values.{i}.value"] = past[2 * i], past[2 * i + 1]
    return feed


def test_io_names_and_dynamic_axes(tiny_target_export):
    out, report = tiny_target_export
    sess = _session(out / "model.onnx")
    layers = report.num_layers
    assert layers == 2 and report.num_kv_heads == 2 and report.head_dim == 8
    ins = {i.name: i for i in sess.get_inputs()}
    outs = {o.name: o for o in sess.get_outputs()}
    expected_in = ["input_ids", "attention_mask", "position_ids"] + [
        f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    expected_out = ["logits"] + [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    assert [i.name for i in sess.get_inputs()] == expected_in
    assert [o.name for o in sess.get_outputs()] == expected_out
    assert ins["input_ids"].type == "tensor(int64)" and ins["position_ids"].type == "tensor(int64)"
    assert ins["past_key_values.0.key"].type == "tensor(float)"
    pk = ins["past_key_values.1.value"].shape
    assert isinstance(pk[0], str) and pk[1] == 2 and isinstance(pk[2], str) and pk[3] == 8
    lg = outs["logits"].shape
    assert isinstance(lg[0], str) and isinstance(lg[1], str) and lg[2] == 64


def test_parity_with_and_without_past(tiny_target_dir, tiny_target_export):
    from tandem.models import load_causal_lm

    out, report = tiny_target_export
    assert report.parity_no_past is not None and report.parity_no_past <= TOL
    assert report.parity_with_past is not None and report.parity_with_past <= TOL
    model, _, _ = load_causal_lm(tiny_target_dir)
    sess = _session(out / "model.onnx")
    layers = report.num_layers
    ids = np.array([[1, 5, 9, 33, 2, 61, 17]], np.int64)
    more = np.array([[40, 3]], np.int64)
    empty = [np.zeros((1, 2, 0, 8), np.float32) for _ in range(2 * layers)]
    logits1, *present = sess.run(None, _feed(ids, empty, layers))
    logits2, *present2 = sess.run(None, _feed(more, present, layers))
    assert present[0].shape == (1, 2, 7, 8) and present2[0].shape == (1, 2, 9, 8)
    # a third call, one token at a time, as the drafter does
    logits3, *_ = sess.run(None, _feed(np.array([[11]], np.int64), present2, layers))
    with torch.no_grad():
        full = model(input_ids=torch.from_numpy(np.concatenate([ids, more, [[11]]], axis=1))).logits.numpy()
    d_no_past = np.abs(logits1 - full[:, :7]).max()
    d_past = np.abs(logits2 - full[:, 7:9]).max()
    d_step = np.abs(logits3 - full[:, 9:]).max()
    print(f"parity: no past {d_no_past:.2e}, with past {d_past:.2e}, single step {d_step:.2e}")
    assert d_no_past <= TOL and d_past <= TOL and d_step <= TOL
    # the KV of the ONNX model is the KV torch computes
    with torch.no_grad():
        cache = model(input_ids=torch.from_numpy(ids), use_cache=True).cache
    np.testing.assert_allclose(present[2], cache.layers[1].keys.numpy(), atol=1e-4)


def test_batch_of_two(tiny_target_dir, tiny_target_export):
    out, report = tiny_target_export
    sess = _session(out / "model.onnx")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 64, (2, 5)).astype(np.int64)
    empty = [np.zeros((2, 2, 0, 8), np.float32) for _ in range(2 * report.num_layers)]
    logits, *_ = sess.run(None, _feed(ids, empty, report.num_layers))
    single, *_ = sess.run(None, _feed(ids[1:], [e[:1] for e in empty], report.num_layers))
    np.testing.assert_allclose(logits[1:], single, atol=1e-5)


def test_metadata(tiny_target_dir, tiny_target_export):
    from tandem.models import load_tokenizer
    from tandem.vocab import tokenizer_vocab_hash

    out, _ = tiny_target_export
    meta = json.loads((out / "drafter.json").read_text())
    assert meta["format"] == "tandem-drafter/1"
    assert meta["num_layers"] == 2 and meta["num_kv_heads"] == 2 and meta["head_dim"] == 8
    assert meta["vocab_size"] == 64 and meta["logits_size"] == 64
    assert meta["vocab_hash"] == tokenizer_vocab_hash(load_tokenizer(tiny_target_dir))
    assert meta["eos_token_ids"] == [2] and meta["max_context"] == 256 and meta["draft_vocab"] is None
    assert (out / "tokenizer.json").exists()


def test_torchscript_exporter_int8_quantized_reports_parity(tiny_drafter_dir, tmp_path):
    """The fallback exporter (dynamo=False) also passes the fp32 check; int8 parity is only reported."""
    from drafter_service.onnx_drafter import OnnxDrafter
    from tandem.export import export_drafter

    report = export_drafter(tiny_drafter_dir, tmp_path, quantize="int8", exporter="torchscript")
    assert report.exporter == "torchscript"
    assert any("fp32 parity" in n for n in report.notes)  # enforced on the fp32 model before quantizing
    assert report.quantize == "int8" and not report.parity_enforced
    assert report.parity_no_past is not None and np.isfinite(report.parity_no_past)
    assert not list(tmp_path.glob(".export-*"))  # the fp32 intermediate is cleaned up
    drafter = OnnxDrafter(tmp_path, threads=1, providers=["CPUExecutionProvider"])
    assert len(drafter.propose("s", 0, [1, 5, 7], 3).tokens) == 3


def test_int4_export_uses_block_quantized_weights(tiny_target_dir, tmp_path):
    """--quantize int4: every MatMul weight becomes MatMulNBits (4 bits, blocks of 32) and the embedding
    GatherBlockQuantized; the file shrinks and the drafter service runs it."""
    import onnx

    from drafter_service.onnx_drafter import OnnxDrafter
    from tandem.export import export_drafter

    report = export_drafter(tiny_target_dir, tmp_path / "q4", quantize="int4")
    fp32 = export_drafter(tiny_target_dir, tmp_path / "fp32", check=False)
    graph = onnx.load(str(tmp_path / "q4" / "model.onnx")).graph
    ops = [n.op_type for n in graph.node]
    weights = {i.name for i in graph.initializer}
    assert ops.count("MatMulNBits") == 2 * 7 + 1 and ops.count("GatherBlockQuantized") == 1  # 2 layers + head
    assert not [n for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights]  # only activations left
    assert report.onnx_bytes < fp32.onnx_bytes  # (1/6.5 on real models; graph overhead dominates here)
    assert np.isfinite(report.parity_no_past) and np.isfinite(report.parity_with_past)
    drafter = OnnxDrafter(tmp_path / "q4", threads=1, providers=["CPUExecutionProvider"])
    assert len(drafter.propose("s", 0, [1, 5, 7], 3).tokens) == 3


def test_refuses_other_architectures():
    from transformers import GPT2Config

    from tandem.export_trace import check_architecture

    with pytest.raises(ValueError, match="Llama-family"):
        check_architecture(GPT2Config())


def test_cli_help_and_args():
    import argparse

    from tandem.export import configure

    parser = configure(argparse.ArgumentParser(prog="tandem export-drafter"))
    text = parser.format_help()
    for flag in ("--model", "--out", "--no-check", "--quantize", "--kv-cache"):
        assert flag in text
    args = parser.parse_args(["--out", "x", "--no-check", "--quantize", "int8"])
    assert args.model == "default" and args.check is False and args.quantize == "int8"


# ------------------------------------------------------------------ the shared-buffer graph (tandem.export_shared_kv)

@pytest.fixture(scope="module")
def hd16_exports(tmp_path_factory):
    """(HF directory, fp32 classic export, int8 classic export) of a tiny Llama with head_dim 16."""
    from tandem.export import export_drafter
    from tiny_models import make_tiny_model

    src = make_tiny_model(tmp_path_factory.mktemp("hd16_src"), seed=5, hidden=32, layers=2, heads=2, kv_heads=1)
    fp32, int8 = tmp_path_factory.mktemp("hd16_fp32"), tmp_path_factory.mktemp("hd16_int8")
    export_drafter(src, fp32, check=False)
    export_drafter(src, int8, check=False, quantize="int8")
    return src, fp32, int8


def test_shared_kv_graph_interface_and_parity_with_torch(hd16_exports, tmp_path):
    """Prompt, a chunk after it, a single step, a rollback (a shorter length, the buffer untouched) and the
    last rows only: each equal to torch's logits for the same sequence."""
    from tandem.export_check import SharedKVRunner
    from tandem.export_shared_kv import convert
    from tandem.models import load_causal_lm

    src, fp32, _ = hd16_exports
    report = convert(fp32, tmp_path, check_prompts=[[1, 5, 9, 33, 2, 61, 17]], steps=3)
    assert report.parity["prompt"]["max_abs_logit_diff"] <= TOL and report.parity["greedy_steps"]["positions"] == 3
    meta = json.loads((tmp_path / "drafter.json").read_text())
    assert meta["kv_cache"] == "shared" and meta["converted_from"]["sha256"].startswith("sha256:")
    sess = _session(tmp_path / "model.onnx")
    ins = {i.name: i for i in sess.get_inputs()}
    assert list(ins) == ["input_ids", *[f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")],
                         "seqlens_k", "total_sequence_length", "logits_to_keep"]
    assert ins["seqlens_k"].type == "tensor(int32)" and ins["past_key_values.0.key"].shape[1:] == [1, "capacity", 16]
    assert [o.name for o in sess.get_outputs()][0] == "logits"
    assert sess.get_modelmeta().custom_metadata_map["max_positions"] == "256"

    model, _, _ = load_causal_lm(src)

    def torch_logits(ids):
        with torch.no_grad():
            return model(input_ids=torch.tensor([ids])).logits[0].numpy()

    ids, more = [1, 5, 9, 33, 2, 61, 17], [40, 3]
    full = torch_logits(ids + more + [11])
    runner = SharedKVRunner(tmp_path / "model.onnx")
    assert np.abs(runner.feed(ids, 7) - full[:7]).max() <= TOL
    assert np.abs(runner.feed(more, 2) - full[7:9]).max() <= TOL
    assert np.abs(runner.feed([11]) - full[9:]).max() <= TOL
    runner.crop(7)                                              # roll back to the prompt
    assert np.abs(runner.feed([40, 4, 8], 1) - torch_logits(ids + [40, 4, 8])[-1:]).max() <= TOL


def test_shared_kv_graph_keeps_the_int8_weights(hd16_exports, tmp_path):
    """Every int8 weight of the classic graph is in the new one unchanged (q/k/v and gate/up side by side),
    the embedding table too; the logits of a prompt fed in one run agree with the classic graph's."""
    import onnx
    from onnx import numpy_helper

    from tandem.export_shared_kv import convert

    _, _, int8 = hd16_exports
    report = convert(int8, tmp_path, check_prompts=[[1, 5, 9, 33, 2, 61, 17, 8, 8, 30]], steps=4)
    old = onnx.load(str(int8 / "model.onnx")).graph
    new = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(tmp_path / "model.onnx")).graph.initializer}
    old_init = {i.name: numpy_helper.to_array(i) for i in old.initializer}
    weights = [old_init[n.input[1]] for n in old.node if n.op_type == "MatMulInteger" and n.input[1] in old_init]
    assert len(weights) == 2 * 7 + 1

    def found(w):
        return any(a.dtype == w.dtype and a.ndim == 2 and a.shape[0] == w.shape[0] and
                   any(np.array_equal(a[:, j:j + w.shape[1]], w) for j in range(0, a.shape[1] - w.shape[1] + 1, 16))
                   for a in new.values())
    assert all(found(w) for w in weights)
    assert any(np.array_equal(a, old_init["lm.model.embed_tokens.weight_quantized"]) for a in new.values())
    assert report.quantized and report.parity["prompt"]["top1_agreement"] == 1.0
    assert report.parity["prompt"]["max_abs_logit_diff"] <= TOL


def test_shared_kv_needs_head_dim_a_multiple_of_16(tiny_drafter_export, tmp_path):
    from tandem.export_shared_kv import convert

    with pytest.raises(ValueError, match="multiple of 16"):
        convert(tiny_drafter_export[0], tmp_path)
