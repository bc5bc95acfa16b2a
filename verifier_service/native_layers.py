"""The decoder's layer loop as one C call (``kernels/decoder_layers.c``), for GGUF blocks on the C kernels.

``decoder.Decoder`` runs its layers through this when every linear is a GGUF weight the C GEMMs read and the
op backend is ``ops.NativeOps``: the same kernels, with the same arguments, in the same order as the Python
loop in ``Decoder._forward``, so every logit is bit-identical to it (tests/unit/test_decoder_layers.py
compares the two on every architecture the decoder runs). What it removes is the interpreter between the
~300 kernel calls of a forward, and the GIL for the forward's whole length (the verifier's gRPC threads run
meanwhile). ``NativeLayers.build`` says why not where a model is not eligible; the Python loop then runs.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from verifier_service.architecture import INTERLEAVED
from verifier_service.quant import function_address

_i64, _ptr, _f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float


class _Linear(ctypes.Structure):
    _fields_ = [("form", _i64), ("kind", _i64), ("parts", _i64), ("fn", _ptr), ("w", _ptr), ("ldw", _i64),
                ("out", _i64), ("inner", _i64), ("kinds", _ptr), ("ldws", _ptr), ("outs", _ptr)]


class _Layer(ctypes.Structure):
    _fields_ = [("qkv", _Linear), ("o", _Linear), ("gate_up", _Linear), ("down", _Linear),
                ("qkv_bias", _ptr), ("q_norm", _ptr), ("k_norm", _ptr), ("post_attn_norm", _ptr),
                ("post_ffn_norm", _ptr), ("ffn_norm", _ptr), ("next_norm", _ptr), ("window", _i64),
                ("rope_group", _i64)]


class _Decoder(ctypes.Structure):
    _fields_ = [("layers", _i64), ("hidden", _i64), ("heads", _i64), ("kv_heads", _i64), ("d", _i64),
                ("ffn", _i64), ("eps", _f32), ("scale", _f32), ("interleaved", _i64), ("attention", _ptr),
                ("gated", _ptr), ("first_norm", _ptr), ("layer", _ptr)]


class _Segment(ctypes.Structure):
    _fields_ = [("kv", _ptr), ("cap", _i64), ("start", _i64), ("first", _i64), ("n", _i64)]


def _tensor(t: torch.Tensor | None, size: int) -> int | None:
    if t is None:
        return None
    if t.dtype != torch.float32 or not t.is_contiguous() or t.numel() != size:
        raise ValueError("a norm or bias that is not a contiguous float32 vector")
    return t.data_ptr()


class NativeLayers:
    """``NativeLayers.build(spec, weights, ops)`` -> (NativeLayers, '') or (None, why not);
    ``run(segments, x, h, rope)`` runs every layer (see ``kernels/decoder_layers.c``)."""

    def __init__(self, spec, weights, ops, rope):
        self.spec = spec
        kernels = ops.lib
        self._fn = kernels.decoder_layers
        layers = (_Layer * spec.layers)()
        for i, (lw, cl) in enumerate(zip(weights.layers, layers)):
            for name in ("qkv", "o", "gate_up", "down"):
                setattr(cl, name, self._linear(getattr(lw, name)))
            cl.qkv_bias = _tensor(lw.qkv_bias, spec.q_rows + 2 * spec.kv_rows)
            cl.q_norm, cl.k_norm = _tensor(lw.q_norm, spec.head_dim), _tensor(lw.k_norm, spec.head_dim)
            cl.post_attn_norm = _tensor(lw.post_attn_norm, spec.hidden)
            cl.post_ffn_norm = _tensor(lw.post_ffn_norm, spec.hidden)
            cl.ffn_norm = _tensor(lw.ffn_norm, spec.hidden)
            following = weights.layers[i + 1].attn_norm if i + 1 < spec.layers else weights.final_norm
            cl.next_norm = _tensor(following, spec.hidden)
            cl.window, cl.rope_group = spec.windows[i], rope.group_of[i]
            shapes = {"qkv": (spec.q_rows + 2 * spec.kv_rows, spec.hidden), "o": (spec.hidden, spec.q_rows),
                      "gate_up": (2 * spec.ffn, spec.hidden), "down": (spec.hidden, spec.ffn)}
            for name, (out, inner) in shapes.items():
                if (getattr(cl, name).out, getattr(cl, name).inner) != (out, inner):
                    raise ValueError(f"layer {i}'s {name} is [{getattr(cl, name).out}, {getattr(cl, name).inner}], "
                                     f"not [{out}, {inner}]")
        self._layers = layers
        gated = ops.gated_kernel(spec.activation)
        self._decoder = _Decoder(spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.head_dim, spec.ffn,
                                 spec.norm_eps, spec.scale, int(spec.rope_layout == INTERLEAVED),
                                 function_address(kernels.attention_blocks), function_address(gated),
                                 _tensor(weights.layers[0].attn_norm, spec.hidden), ctypes.addressof(layers))

    @classmethod
    def build(cls, spec, weights, ops, rope) -> tuple[NativeLayers | None, str]:
        from verifier_service.ops import NativeOps

        if not isinstance(ops, NativeOps):
            return None, "the torch op backend"
        if spec.head_dim % 2:
            return None, f"an odd head size ({spec.head_dim})"
        if ops.gated_kernel(spec.activation) is None:
            return None, f"the activation {spec.activation}"
        try:
            return cls(spec, weights, ops, rope), ""
        except ValueError as e:
            return None, str(e)

    @staticmethod
    def _linear(weight) -> _Linear:
        """The kernel call the weight's own matmul makes (``Weight.kernel_call``)."""
        call = weight.kernel_call()
        if call is None:
            raise ValueError(f"a weight the C GEMMs do not read as one ({type(weight).__name__} {weight.kind})")
        return _Linear(**call)

    def run(self, segments: Sequence[tuple], x: torch.Tensor, h: torch.Tensor, rope) -> None:
        """``segments``: (cache, first position, first row, rows) a session's block; ``x`` [rows, hidden] the
        scaled embeddings (updated in place), ``h`` [rows, hidden] gets the final norm; ``rope``: the
        decoder's ``RopeTables``, extended to every position fed."""
        blocks = (_Segment * len(segments))()
        for b, (cache, start, first, n) in zip(blocks, segments):
            kv = cache.kv
            b.kv, b.cap, b.start, b.first, b.n = kv.data_ptr(), kv.shape[3], start, first, n
        tables = rope.tables
        cos = (_ptr * len(tables))(*(c.data_ptr() for c, _ in tables))
        sin = (_ptr * len(tables))(*(s.data_ptr() for _, s in tables))
        rc = self._fn(ctypes.addressof(self._decoder), ctypes.addressof(blocks), len(segments), cos, sin,
                      x.data_ptr(), x.shape[0], h.data_ptr(), torch.get_num_threads())
        if rc:
            raise RuntimeError("out of memory in the decoder's layers" if rc < 0 else
                               f"a GEMM of layer {rc - 1} refused its input")
