"""Builds the shared-buffer decoder graph (the interface in ``tandem.export_shared_kv``'s docstring) around
the weights of a classic graph (``tandem.export_read``).

The weights are kept as they are: int8 weights stay int8 with their scales, and every quantized linear
keeps the form ``quantize_dynamic`` gives it (DynamicQuantizeLinear of the input, MatMulInteger, Cast,
Mul by the two scales); the q/k/v projections become one MatMulInteger with per-column scales, gate and
up another (the same integers and the same products). The RMS norms keep the exported form (Pow,
ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul); the rotary tables are ONNX Runtime's own Cos and Sin of
the graph's ``inv_freq``. The head quantizes every fed row together, as the classic graph does, and
multiplies the returned rows only, so a row's logits do not depend on how many rows are returned. What
differs is the attention kernel: GroupQueryAttention's rotary and softmax round differently from the
exported Mul/Add/Softmax ops, and the int8 quantization of the attention output can turn those float32
roundings into differences of a few tenths of a logit (the classic graph's own logits move as much when
the same tokens are fed in different runs). ``tandem.export_check.parity`` measures both on the same
token feeds.
"""

from __future__ import annotations

import numpy as np

from tandem.export_read import DecoderWeights, Linear

SHARED_KV = "shared"                   # drafter.json "kv_cache" of the graphs written here
OPSET = 20
IR_VERSION = 10                        # what onnxruntime 1.2x loads


def rotary_tables(inv_freq: np.ndarray, max_positions: int, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [max_positions, head_dim / 2] of position * inv_freq, computed by ONNX Runtime's Cos and Sin
    (float32 products, as the classic graph computes them at each position)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    freqs = np.arange(max_positions, dtype=np.float32)[:, None] * inv_freq[None, :].astype(np.float32)
    graph = helper.make_graph([helper.make_node("Cos", ["f"], ["c"]), helper.make_node("Sin", ["f"], ["s"])], "rotary",
                              [helper.make_tensor_value_info("f", TensorProto.FLOAT, [None, None])],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("s", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    cos, sin = sess.run(None, {"f": freqs})
    if scale != 1.0:
        cos, sin = cos * np.float32(scale), sin * np.float32(scale)
    return np.ascontiguousarray(cos), np.ascontiguousarray(sin)


class _Builder:
    def __init__(self):
        self.nodes, self.inits = [], []

    def init(self, name: str, value) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str], domain: str = "", **attrs):
        from onnx import helper

        self.nodes.append(helper.make_node(op, inputs, outputs, name=f"{outputs[0]}/{op}", domain=domain, **attrs))
        return outputs[0] if len(outputs) == 1 else outputs

    def rms_norm(self, x: str, weight: str, tag: str) -> str:
        """The exported form of an RMS norm: weight * (x * 1 / sqrt(mean(x^2) + eps))."""
        p = self.node("Pow", [x, "two"], [f"{tag}/pow"])
        mean = self.node("ReduceMean", [p, "last_axis"], [f"{tag}/mean"], keepdims=1)
        s = self.node("Sqrt", [self.node("Add", [mean, "eps"], [f"{tag}/add_eps"])], [f"{tag}/sqrt"])
        r = self.node("Reciprocal", [s], [f"{tag}/rsqrt"])
        return self.node("Mul", [weight, self.node("Mul", [x, r], [f"{tag}/scaled"])], [f"{tag}/out"])

    def last_rows(self, x: str, tag: str) -> str:
        """The last ``logits_to_keep`` positions of x [1, seq, ...]."""
        return self.node("Slice", [x, "keep_from", "to_end", "seq_axis"], [f"{tag}/last_rows"])

    def linears(self, x: str, parts: list[Linear], tag: str, last_rows: bool = False) -> str:
        """x @ concat(parts) (one MatMul: parts share the input); quantized parts keep the quantize_dynamic form.
        ``last_rows``: for the last ``logits_to_keep`` positions only (x is quantized over all of them first,
        so each row is what the classic graph computes for it, whatever was fed with it)."""
        if not parts[0].quantized:
            w = self.init(f"{tag}/weight", np.concatenate([p.weight for p in parts], axis=1))
            return self.node("MatMul", [self.last_rows(x, tag) if last_rows else x, w], [f"{tag}/out"])
        zp = parts[0].zero_point
        if any(p.weight.dtype != parts[0].weight.dtype or not np.array_equal(p.zero_point, zp) for p in parts):
            raise ValueError(f"{tag}: quantized parts with different zero points cannot share a MatMulInteger")
        if len(parts) == 1:
            scale = parts[0].scale
        else:
            scale = np.concatenate([np.broadcast_to(p.scale, (p.weight.shape[1],)) for p in parts]).astype(np.float32)
        w = self.init(f"{tag}/weight_quantized", np.concatenate([p.weight for p in parts], axis=1))
        ws = self.init(f"{tag}/weight_scale", scale)
        wz = self.init(f"{tag}/weight_zero_point", zp)
        xq, xs, xz = self.node("DynamicQuantizeLinear", [x],
                               [f"{tag}/x_quantized", f"{tag}/x_scale", f"{tag}/x_zero_point"])
        if last_rows:
            xq = self.last_rows(xq, tag)
        scales = self.node("Mul", [xs, ws], [f"{tag}/scales"])
        acc = self.node("MatMulInteger", [xq, w, xz, wz], [f"{tag}/int"])
        return self.node("Mul", [self.node("Cast", [acc], [f"{tag}/float"], to=1), scales], [f"{tag}/out"])


def build_shared_kv(weights: DecoderWeights, max_positions: int):
    """The shared-buffer decoder graph (module docstring) of ``weights``, rotary tables for ``max_positions``."""
    from onnx import TensorProto, helper

    w = weights
    b = _Builder()
    b.init("two", np.float32(2.0))
    b.init("eps", np.float32(w.eps))
    b.init("last_axis", np.array([-1], np.int64))
    b.init("seq_axis", np.array([1], np.int64))
    b.init("to_end", np.array([np.iinfo(np.int64).max], np.int64))
    cos, sin = rotary_tables(w.inv_freq, max_positions, w.rotary_scale)
    b.init("cos_cache", cos)
    b.init("sin_cache", sin)

    table = b.init("embed_tokens/weight" + ("_quantized" if w.embedding_scale is not None else ""), w.embedding)
    x = b.node("Gather", [table, "input_ids"], ["embed_tokens/gathered"])
    if w.embedding_scale is not None:
        x = b.node("DequantizeLinear", [x, b.init("embed_tokens/weight_scale", w.embedding_scale),
                                        b.init("embed_tokens/weight_zero_point", w.embedding_zero_point)],
                   ["embed_tokens/out"])
    for i, layer in enumerate(w.layers):
        t = f"layers.{i}"
        h = b.rms_norm(x, b.init(f"{t}/input_norm/weight", layer.input_norm), f"{t}/input_norm")
        qkv = b.linears(h, [layer.q, layer.k, layer.v], f"{t}/qkv")
        attn = b.node("GroupQueryAttention",
                      [qkv, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value", "seqlens_k",
                       "total_sequence_length", "cos_cache", "sin_cache"],
                      [f"{t}/attention", f"present.{i}.key", f"present.{i}.value"], domain="com.microsoft",
                      num_heads=w.num_heads, kv_num_heads=w.num_kv_heads, do_rotary=1, rotary_interleaved=0,
                      scale=float(1.0 / np.sqrt(w.head_dim)))[0]
        x = b.node("Add", [x, b.linears(attn, [layer.o], f"{t}/o_proj")], [f"{t}/attention_residual"])
        h = b.rms_norm(x, b.init(f"{t}/post_norm/weight", layer.post_norm), f"{t}/post_norm")
        gate, up = b.node("Split", [b.linears(h, [layer.gate, layer.up], f"{t}/gate_up"),
                                    b.init(f"{t}/gate_up/sizes", np.array([layer.gate.weight.shape[1]] * 2, np.int64))],
                          [f"{t}/gate", f"{t}/up"], axis=-1)
        silu = b.node("Mul", [gate, b.node("Sigmoid", [gate], [f"{t}/sigmoid"])], [f"{t}/silu"])
        down = b.linears(b.node("Mul", [silu, up], [f"{t}/gated"]), [layer.down], f"{t}/down_proj")
        x = b.node("Add", [x, down], [f"{t}/mlp_residual"])
    b.node("Neg", ["logits_to_keep"], ["keep_from"])
    h = b.rms_norm(x, b.init("norm/weight", w.final_norm), "norm")
    b.linears(h, [w.head], "lm_head", last_rows=True)
    b.nodes[-1].output[0] = "logits"                 # the head's last node writes the graph output
    layers, kv, dim = len(w.layers), w.num_kv_heads, w.head_dim
    cache = [helper.make_tensor_value_info(f"past_key_values.{i}.{n}", TensorProto.FLOAT, [1, kv, "capacity", dim])
             for i in range(layers) for n in ("key", "value")]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "seq"]), *cache,
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
              helper.make_tensor_value_info("logits_to_keep", TensorProto.INT64, [1])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "rows", w.head.weight.shape[1]])]
    outputs += [helper.make_tensor_value_info(f"present.{i}.{n}", TensorProto.FLOAT, [1, kv, "capacity", dim])
                for i in range(layers) for n in ("key", "value")]
    graph = helper.make_graph(b.nodes, "drafter_shared_kv", inputs, outputs, b.inits)
    model = helper.make_model(graph, ir_version=IR_VERSION, producer_name="tandem.export_shared_kv",
                              opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)])
    helper.set_model_props(model, {"kv_cache": SHARED_KV, "max_positions": str(max_positions)})
    return model
