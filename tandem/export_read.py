"""Reads the weights of a classic decoder-with-past drafter graph (``tandem.export``: either exporter,
fp32 or int8) back into numpy arrays, for ``tandem.export_shared_kv`` to rebuild the graph around them.

The graph is read by shape, not by node names (the two exporters name nodes differently): the linears
are the MatMul / MatMulInteger nodes with a constant 2-D weight, in execution order (q, k, v, o, gate,
up, down per layer, then the head); the RMS norm weights are the constant vectors of ``hidden`` floats
that a Mul applies; the rotary ``inv_freq`` is the constant of head_dim / 2 floats above the Cos node.
int8 weights are kept as they are, with the scale and zero point ``quantize_dynamic`` gave them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np


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
    """One decoder layer: its two RMS norm weights and seven linears."""

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
