"""Rewrites a drafter's decoder-with-past ONNX graph into one whose KV cache is a buffer shared by past and present.

The graph ``tandem.export`` writes returns ``present = concat(past, new)`` on every run, so each drafted
token copies the whole KV cache (and, in the exported attention, expands the KV heads to the query heads,
transposes the keys and builds a causal mask over the whole context): on a 2-core CPU that is most of a
drafted token's cost past a few hundred tokens of context. The graph written here attends with ONNX
Runtime's ``GroupQueryAttention`` (com.microsoft; rotary embedding inside) over KV buffers of a fixed
capacity that the caller binds as both ``past`` and ``present`` (I/O binding): a run writes the new rows in
place and reads the rest where they are. Rolling back is free (the next run passes a shorter length), and
the output head runs on the last ``logits_to_keep`` positions only, so feeding n tokens of catch-up costs
one head, not n::

    inputs   input_ids                 int64   [1, seq]
             past_key_values.{i}.key   float32 [1, kv_heads, capacity, head_dim]   (i = 0 .. layers-1)
             past_key_values.{i}.value float32 [1, kv_heads, capacity, head_dim]
             seqlens_k                 int32   [1]   past + seq - 1
             total_sequence_length     int32   []    past + seq
             logits_to_keep            int64   [1]   how many of the last positions get logits (1 .. seq)
    outputs  logits                    float32 [1, logits_to_keep, vocab]
             present.{i}.key           float32 [1, kv_heads, capacity, head_dim]   (the past buffer, rows
             present.{i}.value         float32 [1, kv_heads, capacity, head_dim]    [past, past+seq) written)

``capacity`` is the caller's choice (at least past + seq, at most ``max_positions``, the rows of the rotary
tables; the ONNX metadata ``max_positions`` says how many). ``drafter.json`` says ``"kv_cache": "shared"``.

The weights are read back from the classic graph (either exporter, fp32 or int8) and kept as they are:
int8 weights stay int8 with their scales, and every quantized linear keeps the form ``quantize_dynamic``
gives it (DynamicQuantizeLinear of the input, MatMulInteger, Cast, Mul by the two scales); the q/k/v
projections become one MatMulInteger with per-column scales, gate and up another (the same integers and
the same products). The RMS norms keep the exported form (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul,
Mul); the rotary tables are ONNX Runtime's own Cos and Sin of the graph's ``inv_freq``. The head
quantizes every fed row together, as the classic graph does, and multiplies the returned rows only, so
a row's logits do not depend on how many rows are returned. What differs is the attention kernel:
GroupQueryAttention's rotary and softmax round differently from the exported Mul/Add/Softmax ops, and
the int8 quantization of the attention output can turn those float32 roundings into differences of a
few tenths of a logit (the classic graph's own logits move as much when the same tokens are fed in
different runs). ``parity`` measures both on the same token feeds.

    python -m tandem.export_shared_kv --from OLD_DIR --out NEW_DIR [--check-prompts 24]

The conversion needs onnx, onnxruntime and numpy; the check's held-out prompts need the tokenizer
(transformers).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

MODEL_FILE = "model.onnx"
METADATA_FILE = "drafter.json"
SHARED_KV = "shared"                   # drafter.json "kv_cache" of the graphs written here
OPSET = 20
IR_VERSION = 10                        # what onnxruntime 1.2x loads
PARITY_TOLERANCE = 1e-3                # fp32 graphs: max |logit| difference enforced


@dataclass
class Linear:
    """y = x @ weight [in, out]; int8 weights carry their per-tensor ``scale`` and ``zero_point``."""

    weight: np.ndarray
    scale: np.ndarray | None = None
    zero_point: np.ndarray | None = None

    @property
    def quantized(self) -> bool:
        return self.scale is not None


@dataclass
class Layer:
    input_norm: np.ndarray
    post_norm: np.ndarray
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    gate: Linear
    up: Linear
    down: Linear


@dataclass
class DecoderWeights:
    """A Llama-family decoder as the classic graph holds it."""

    embedding: np.ndarray                       # [vocab, hidden] float32, or quantized with the two below
    embedding_scale: np.ndarray | None
    embedding_zero_point: np.ndarray | None
    layers: list[Layer]
    final_norm: np.ndarray
    head: Linear
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    inv_freq: np.ndarray                         # [head_dim / 2] float32
    rotary_scale: float = 1.0                   # multiplies cos and sin (1 unless the rope type scales)


@dataclass
class ConversionReport:
    source: str
    onnx_path: str
    quantized: bool
    num_layers: int
    max_positions: int
    nodes_before: int
    nodes_after: int
    parity: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------------- reading

class _Graph:
    """Lookups over a loaded ONNX graph: constants (initializers and Constant nodes), producers, consumers."""

    def __init__(self, model):
        from onnx import numpy_helper

        g = model.graph
        self.nodes = list(g.node)
        self.consts = {i.name: numpy_helper.to_array(i) for i in g.initializer}
        for n in self.nodes:
            if n.op_type == "Constant":
                for a in n.attribute:
                    if a.name == "value":
                        self.consts[n.output[0]] = numpy_helper.to_array(a.t)
        self.producer = {o: n for n in self.nodes for o in n.output}
        self.consumers: dict[str, list] = {}
        for n in self.nodes:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.inputs = {i.name: i for i in g.input}

    def const(self, name: str) -> np.ndarray | None:
        return self.consts.get(name)

    def only_consumer(self, name: str, op: str):
        users = self.consumers.get(name, [])
        if len(users) != 1 or users[0].op_type != op:
            return None
        return users[0]


def _quantized_scale(g: _Graph, matmul) -> np.ndarray:
    """The weight scale of a quantize_dynamic linear: MatMulInteger -> Cast -> Mul(., Mul(a_scale, b_scale))."""
    cast = g.only_consumer(matmul.output[0], "Cast")
    mul = g.only_consumer(cast.output[0], "Mul") if cast is not None else None
    if mul is None:
        raise ValueError(f"{matmul.name}: not the MatMulInteger -> Cast -> Mul form of a quantized linear")
    other = next(i for i in mul.input if i != cast.output[0])
    scales = g.producer.get(other)
    found = [g.const(i) for i in scales.input] if scales is not None and scales.op_type == "Mul" else []
    found = [s for s in found if s is not None]
    if len(found) != 1:
        raise ValueError(f"{matmul.name}: cannot find the weight scale of the quantized linear")
    return found[0].astype(np.float32)


def _linears(g: _Graph) -> list[Linear]:
    """Every linear with a constant weight, in graph order (the exporters emit them in execution order)."""
    out = []
    for n in g.nodes:
        w = g.const(n.input[1]) if len(n.input) > 1 else None
        if w is None or w.ndim != 2:
            continue
        if n.op_type == "MatMul":
            out.append(Linear(w.astype(np.float32)))
        elif n.op_type == "MatMulInteger":
            zp = g.const(n.input[3]) if len(n.input) > 3 and n.input[3] else np.zeros((), w.dtype)
            out.append(Linear(w, _quantized_scale(g, n), zp))
    return out


def _embedding(g: _Graph) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    gathers = [n for n in g.nodes
               if n.op_type == "Gather" and n.input[1] == "input_ids" and g.const(n.input[0]) is not None]
    if len(gathers) != 1:
        raise ValueError("cannot find the token embedding (a Gather of a constant table by input_ids)")
    table = g.const(gathers[0].input[0])
    if table.dtype == np.float32:
        return table, None, None
    deq = g.only_consumer(gathers[0].output[0], "DequantizeLinear")
    if deq is None:
        raise ValueError(f"the embedding table is {table.dtype} but not dequantized by a DequantizeLinear")
    return table, g.const(deq.input[1]), g.const(deq.input[2]) if len(deq.input) > 2 else None


def _norm_weights(g: _Graph, hidden: int) -> list[np.ndarray]:
    """The RMS norm weights, in graph order: Mul by a constant float vector of ``hidden`` elements."""
    found = []
    for n in g.nodes:
        if n.op_type != "Mul":
            continue
        for i in n.input:
            c = g.const(i)
            if c is not None and c.dtype == np.float32 and c.shape == (hidden,):
                found.append(c)
    return found


def _eps(g: _Graph) -> float:
    for n in g.nodes:
        if n.op_type == "ReduceMean":
            add = g.only_consumer(n.output[0], "Add")
            if add is not None:
                c = [g.const(i) for i in add.input if g.const(i) is not None]
                if c and c[0].size == 1:
                    return float(c[0].reshape(()))
    raise ValueError("cannot find the RMS norm epsilon (ReduceMean -> Add of a constant)")


def _rotary(g: _Graph, head_dim: int) -> tuple[np.ndarray, float]:
    """(inv_freq, the factor multiplying cos and sin): the first constant of head_dim / 2 floats above Cos."""
    cos = next((n for n in g.nodes if n.op_type == "Cos"), None)
    if cos is None:
        raise ValueError("cannot find the rotary embedding (no Cos node)")
    seen, todo, inv_freq = set(), deque([cos]), None
    while todo and inv_freq is None:
        node = todo.popleft()
        for i in node.input:
            c = g.const(i)
            if c is not None and c.dtype == np.float32 and c.size == head_dim // 2:
                inv_freq = c.reshape(-1)
                break
            p = g.producer.get(i)
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                todo.append(p)
    if inv_freq is None:
        raise ValueError(f"cannot find the rotary inv_freq ({head_dim // 2} floats) above the Cos node")
    scale = 1.0
    mul = g.only_consumer(cos.output[0], "Mul")
    if mul is not None:
        c = [g.const(i) for i in mul.input if g.const(i) is not None]
        if c and c[0].size == 1:
            scale = float(c[0].reshape(()))
    return inv_freq.astype(np.float32), scale


def read_classic(onnx_path) -> DecoderWeights:
    """The weights of a classic decoder-with-past graph (``tandem.export``: dynamo or TorchScript, fp32 or int8)."""
    import onnx

    model = onnx.load(str(onnx_path))
    g = _Graph(model)
    past = [n for n in g.inputs if n.startswith("past_key_values.") and n.endswith(".key")]
    if not past or "attention_mask" not in g.inputs:
        raise ValueError(f"{onnx_path} is not a classic decoder-with-past graph (inputs {sorted(g.inputs)[:6]}...)")
    dims = g.inputs["past_key_values.0.key"].type.tensor_type.shape.dim
    num_kv_heads, head_dim = int(dims[1].dim_value), int(dims[3].dim_value)
    num_layers = len(past)
    linears = _linears(g)
    if len(linears) != 7 * num_layers + 1:
        raise ValueError(f"{onnx_path}: expected {7 * num_layers + 1} linears (q, k, v, o, gate, up, down per layer "
                         f"and the head), found {len(linears)}")
    layers_lin = [linears[7 * i:7 * i + 7] for i in range(num_layers)]
    hidden = layers_lin[0][0].weight.shape[0]
    norms = _norm_weights(g, hidden)
    if len(norms) != 2 * num_layers + 1:
        raise ValueError(f"{onnx_path}: expected {2 * num_layers + 1} RMS norm weights, found {len(norms)}")
    layers = [Layer(norms[2 * i], norms[2 * i + 1], *lin) for i, lin in enumerate(layers_lin)]
    for i, layer in enumerate(layers):
        shapes = [x.weight.shape for x in (layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down)]
        inter = shapes[4][1]
        kv = num_kv_heads * head_dim
        want = [(hidden, shapes[0][1]), (hidden, kv), (hidden, kv), (shapes[0][1], hidden), (hidden, inter),
                (hidden, inter), (inter, hidden)]
        if shapes != want:
            raise ValueError(f"{onnx_path}: layer {i} linears have shapes {shapes}, expected {want}")
    embedding, e_scale, e_zp = _embedding(g)
    inv_freq, rotary_scale = _rotary(g, head_dim)
    return DecoderWeights(embedding, e_scale, e_zp, layers, norms[-1], linears[-1],
                          num_heads=layers[0].q.weight.shape[1] // head_dim, num_kv_heads=num_kv_heads,
                          head_dim=head_dim, eps=_eps(g), inv_freq=inv_freq, rotary_scale=rotary_scale)


# ---------------------------------------------------------------------------------------------- building

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


# ---------------------------------------------------------------------------------------------- running

def _session(onnx_path, threads: int, profile_prefix: str | None):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    if profile_prefix:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    return ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])


class SharedKVRunner:
    """Feeds tokens to a shared-buffer graph through the drafter service's own KV buffers
    (drafter_service.kv_buffers). ``profile_prefix``: ORT profiling on."""

    def __init__(self, onnx_path, threads: int = 1, profile_prefix: str | None = None):
        from drafter_service.kv_buffers import SharedKV, SharedKVGraph

        self.session = _session(onnx_path, threads, profile_prefix)
        past = [i for i in self.session.get_inputs() if i.name.startswith("past_key_values.")]
        _, kv, _, dim = past[0].shape
        logits = {o.name: o for o in self.session.get_outputs()}["logits"].shape[-1]
        positions = int(self.session.get_modelmeta().custom_metadata_map["max_positions"])
        self.kv = SharedKV(SharedKVGraph(self.session, tuple(p.name for p in past), kv, dim, np.float32, logits,
                                         positions))

    @property
    def length(self) -> int:
        return self.kv.length

    def crop(self, length: int) -> None:
        """Keeps the first ``length`` tokens (a rollback: the buffers are not touched)."""
        self.kv.crop(length)

    def feed(self, ids: list[int], rows: int = 1) -> np.ndarray:
        """Logits [rows, vocab] of the last ``rows`` of ``ids``, fed after what the buffers hold."""
        return self.kv.run(ids, rows)[0].copy()


class ClassicRunner:
    """Feeds tokens to a classic decoder-with-past graph (present = concat(past, new))."""

    def __init__(self, onnx_path, threads: int = 1, profile_prefix: str | None = None):
        self.session = _session(onnx_path, threads, profile_prefix)
        past = [i for i in self.session.get_inputs() if i.name.startswith("past_key_values.")]
        self.names = [p.name for p in past]
        _, kv, _, dim = past[0].shape
        self.past = [np.zeros((1, kv, 0, dim), np.float32) for _ in past]

    @property
    def length(self) -> int:
        return self.past[0].shape[2]

    def feed(self, ids: list[int], rows: int = 1) -> np.ndarray:
        p, n = self.length, len(ids)
        feed = {"input_ids": np.asarray([ids], np.int64), "attention_mask": np.ones((1, p + n), np.int64),
                "position_ids": np.arange(p, p + n, dtype=np.int64)[None]}
        feed.update(zip(self.names, self.past))
        out = self.session.run(None, feed)
        self.past = out[1:]
        return out[0][0, -rows:]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _compare(a: np.ndarray, b: np.ndarray, acc: dict) -> None:
    acc["max_abs_logit_diff"] = max(acc.get("max_abs_logit_diff", 0.0), float(np.abs(a - b).max()))
    acc["max_abs_q_diff"] = max(acc.get("max_abs_q_diff", 0.0), float(np.abs(_softmax(a) - _softmax(b)).max()))
    acc["positions"] = acc.get("positions", 0) + a.shape[0]
    acc["top1_equal"] = acc.get("top1_equal", 0) + int((a.argmax(-1) == b.argmax(-1)).sum())
    acc["identical_rows"] = acc.get("identical_rows", 0) + int((a == b).all(-1).sum())


def parity(classic_onnx, shared_onnx, prompts: list[list[int]], steps: int = 32,
           draft_vocab: np.ndarray | None = None, chunk: int = 64) -> dict:
    """The two graphs fed the same tokens: each prompt in one run (logits of every position, and of the last
    one alone), then ``steps`` greedy tokens of the classic graph one at a time. Per phase: max |logit| and
    |q| differences (q: softmax at temperature 1), top-1 agreement, rows bit-identical. For scale,
    ``classic_chunked`` is the classic graph against itself with the prompt fed in runs of ``chunk`` tokens
    (int8 activations are quantized per run, so the classic graph's own logits depend on how the tokens were
    batched)."""
    phases = ("prompt", "prompt_last_row", "greedy_steps", "classic_chunked")
    out: dict = {"prompts": len(prompts), "steps": steps, **{p: {} for p in phases}}
    for ids in prompts:
        old, new = ClassicRunner(classic_onnx), SharedKVRunner(shared_onnx)
        a = old.feed(ids, len(ids))
        _compare(a, SharedKVRunner(shared_onnx).feed(ids, len(ids)), out["prompt"])
        _compare(a[-1:], new.feed(ids, 1), out["prompt_last_row"])      # the head on the returned row only
        chunked = ClassicRunner(classic_onnx)
        runs = [ids[i:i + chunk] for i in range(0, len(ids), chunk)]
        rows = np.concatenate([chunked.feed(run, len(run)) for run in runs])
        _compare(a, rows, out["classic_chunked"])
        logits = a[-1]
        for _ in range(steps):
            idx = int(np.argmax(logits))
            tok = int(draft_vocab[idx]) if draft_vocab is not None else idx
            la, lb = old.feed([tok]), new.feed([tok])
            _compare(la, lb, out["greedy_steps"])
            logits = la[-1]
    for phase in phases:
        d = out[phase]
        d["top1_agreement"] = d.pop("top1_equal") / max(1, d["positions"])
    return out


# ---------------------------------------------------------------------------------------------- converting

def _source_paths(source) -> tuple[Path, Path]:
    src = Path(source).expanduser()
    onnx_path = src / MODEL_FILE if src.is_dir() else src
    if not onnx_path.exists():
        raise FileNotFoundError(f"{onnx_path} not found")
    return onnx_path, onnx_path.parent / METADATA_FILE


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def heldout_prompts(drafter_dir, count: int, max_tokens: int = 512) -> list[list[int]]:
    """The first ``count`` held-out Spec-Bench prompts (``tandem.bench.workload``, split "bench", interleaved by
    category) in the drafter's chat template, as token ids (at most ``max_tokens``)."""
    from transformers import AutoTokenizer

    from tandem.bench.workload import interleave_by_category, load_questions

    tok = AutoTokenizer.from_pretrained(str(drafter_dir))
    out = []
    for p in interleave_by_category(load_questions(split="bench"))[:count]:
        ids = tok.apply_chat_template([{"role": "user", "content": p.text}], add_generation_prompt=True,
                                      tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        out.append([int(i) for i in ids][:max_tokens])
    return out


def convert(source, out_dir, *, max_positions: int | None = None, check_prompts: list[list[int]] | None = None,
            steps: int = 32) -> ConversionReport:
    """Writes ``out_dir/model.onnx`` (the shared-buffer graph of the classic drafter ``source``, a directory or
    .onnx file) and ``drafter.json`` (the source's, plus ``kv_cache`` and ``converted_from``); copies the other
    files of a source directory. ``max_positions``: the rows of the rotary tables (default: drafter.json's
    max_context). With ``check_prompts`` (token ids) the parity check runs; fp32 graphs must agree within
    1e-3, int8 graphs are reported only."""
    import onnx

    onnx_path, meta_path = _source_paths(source)
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if meta.get("kv_cache") == SHARED_KV:
        raise ValueError(f"{onnx_path} is already a shared-buffer graph")
    max_positions = int(max_positions or meta.get("max_context") or 0)
    if max_positions <= 0:
        raise ValueError("the rotary tables need a length: give max_positions (no max_context in drafter.json)")
    weights = read_classic(onnx_path)
    if weights.head_dim % 16:
        raise ValueError(f"{onnx_path}: ONNX Runtime's GroupQueryAttention needs a head_dim that is a multiple of 16 "
                         f"(this model's is {weights.head_dim}); keep the classic graph")
    model = build_shared_kv(weights, max_positions)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    nodes_before = len(onnx.load(str(onnx_path), load_external_data=False).graph.node)
    source_sha = _sha256(onnx_path)
    with tempfile.TemporaryDirectory(dir=out, prefix=".shared-kv-") as tmp:
        written = Path(tmp) / MODEL_FILE
        onnx.save(model, str(written))
        report = ConversionReport(source=str(onnx_path), onnx_path=str(out / MODEL_FILE),
                                  quantized=weights.head.quantized, num_layers=len(weights.layers),
                                  max_positions=max_positions, nodes_before=nodes_before,
                                  nodes_after=len(model.graph.node))
        if check_prompts:
            dv = meta.get("draft_vocab")
            draft_vocab = np.load(onnx_path.parent / dv) if dv else None
            report.parity = parity(onnx_path, written, check_prompts, steps, draft_vocab)
            worst = max(report.parity[p]["max_abs_logit_diff"] for p in ("prompt", "greedy_steps"))
            if not report.quantized and worst > PARITY_TOLERANCE:
                raise RuntimeError(f"the shared-buffer graph does not match {onnx_path}: max logits diff {worst:.3g} "
                                   f"> {PARITY_TOLERANCE}")
        if onnx_path.parent.resolve() != out.resolve():
            for f in onnx_path.parent.iterdir():
                if f.is_file() and f.name not in (MODEL_FILE, METADATA_FILE) and not f.name.startswith(MODEL_FILE):
                    shutil.copy2(f, out / f.name)
        shutil.move(str(written), out / MODEL_FILE)
    meta = {**meta, "kv_cache": SHARED_KV,
            "converted_from": {"file": onnx_path.name, "sha256": source_sha, "by": "python -m tandem.export_shared_kv"}}
    if not meta.get("max_context"):
        meta["max_context"] = max_positions
    (out / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tandem.export_shared_kv", description=__doc__.split("\n")[0])
    p.add_argument("--from", dest="source", required=True, metavar="DIR",
                   help="a classic drafter (directory with model.onnx and drafter.json, or the .onnx file)")
    p.add_argument("--out", required=True, metavar="DIR", help="where to write model.onnx and drafter.json "
                   "(the other files of the source directory are copied); may be the source directory")
    p.add_argument("--max-positions", type=int, default=None,
                   help="rows of the rotary tables, the longest context (default: drafter.json max_context)")
    p.add_argument("--check-prompts", type=int, default=24, metavar="N",
                   help="parity check on the first N held-out Spec-Bench prompts in the drafter's chat template "
                        "(needs the tokenizer files and transformers; 0: no check). Default: %(default)s")
    p.add_argument("--steps", type=int, default=32, help="greedy tokens per prompt in the check (default 32)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    onnx_path, _ = _source_paths(args.source)
    prompts = heldout_prompts(onnx_path.parent, args.check_prompts) if args.check_prompts else None
    try:
        report = convert(args.source, args.out, max_positions=args.max_positions, check_prompts=prompts,
                         steps=args.steps)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"tandem.export_shared_kv: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(f"{report.onnx_path}: {report.nodes_before} -> {report.nodes_after} nodes, "
              f"rotary tables for {report.max_positions} positions")
        for phase, d in report.parity.items():
            if isinstance(d, dict):
                print(f"  {phase:16s} positions {d['positions']:6d}  top-1 agreement {d['top1_agreement']:.4f}  "
                      f"rows identical {d['identical_rows']}  max |logit diff| {d['max_abs_logit_diff']:.3g}  "
                      f"max |q diff| {d['max_abs_q_diff']:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
