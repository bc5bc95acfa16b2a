"""Quantized weights read as stored in a GGUF file, and the decoder's row ops, on the C kernels of ``native``.

``QuantWeight(kind, raw, out, inner)``: one weight [out, inner] as the file's block bytes (``raw``: [out, bytes
a row], e.g. a numpy view into the GGUF mapping, kept as is: a weight costs its file size and can stay
memory-mapped). Kinds: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (``KINDS``).
  * ``matmul(x, bias)``: x [n, inner] fp32 -> x W^T (+ bias) [n, out]. Each weight is rebuilt in registers with
    gguf-py's arithmetic (the fp32 weights transformers loads, bit for bit); only the summation order is the
    kernel's. A row's result does not depend on n or the thread count (exact rows).
  * ``rows(ids)``: the exact fp32 weights of those rows (an embedding lookup); ``dequantize()``: all of them.

``Ops``: attention (exact rows, optional sliding window) and the row-wise glue on torch tensors.

Both use the ISA ``native.isa()`` picks (``TANDEM_ISA`` / ``--isa`` forces one), or the one passed as ``isa``.

Activations (``TANDEM_ACTIVATIONS`` / the verifier's ``--activations``, or ``activations=``): 'fp32' (the
default of a weight on its own; the verifier's 'auto' picks one of the two per file: ``activation_choice``):
the rebuilt weights times x in fp32, agreeing with transformers' forward of the file to fp32 rounding) or
'int8': x rounded to int8 per 32 values and multiplied in integers, llama.cpp's arithmetic for quantized
weights (kernels/gemm_q8.h; the forward 20-40 % faster on Zen 3; each value of x moves by up to half a
rounding step). Kinds without an int8 form (F32, F16, BF16) stay fp32. Rows are exact either way, so plain steps
and verify blocks agree bit for bit whichever is chosen. With fp32 activations, Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 weights are
read from a copy whose blocks hold their scales as fp32 (``QuantWeight.scaled``, kernels/quants.h ``TQ_SCALED``):
the same weights and bits, a broadcast load a scale instead of a conversion and register shuffles (on Zen 4 the
fp32 forward is bound by its shuffles: BENCHMARKS.md, twenty-sixth session); 2-4 bytes more a block of 32. On x86, int8 Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q5_K/Q6_K weights are also copied
once into the x8 layout (8 weight rows interleaved, ``QuantWeight.x8``), which computes the same bits with
less work per weight; ``rows()`` reads it (and the fp32-scale copy) too, so a GGUF target's loader releases the
file's pages (``GgufModel._weight``): the copy takes their place in RAM.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from verifier_service import native

KINDS = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
INT8_KINDS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")   # kernels/gemm_q8.h
X8_KINDS = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K")   # int8 also on 8 interleaved weight rows (kernels/gemm_q8x8_x86.h)
SCALED_KINDS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")   # fp32 also with fp32 scales (kernels/quants.h, TQ_SCALED)
SCALED = 256                                               # kernels/quants.h: TQ_SCALED + a kind = its scaled form
AUTO = "auto"               # the verifier's default: chosen per file (activation_choice), fp32 for a lone weight
ACTIVATIONS = ("fp32", "int8", AUTO)
ACTIVATIONS_ENV = "TANDEM_ACTIVATIONS"
CHUNK = 32   # every row is whole 32-weight chunks (and whole blocks of its kind)


def activation_mode(value: str | None = None) -> str:
    """The activation arithmetic asked for: ``value``, else ``TANDEM_ACTIVATIONS``, else 'fp32'; 'auto' as asked
    (``activation_choice.settle`` turns it into one of the two for a GGUF target before its weights load).
    ValueError naming the flag for anything else."""
    import os

    chosen = (value if value is not None else os.environ.get(ACTIVATIONS_ENV, "")).strip().lower() or "fp32"
    if chosen not in ACTIVATIONS:
        raise ValueError(f"--activations {chosen!r} ({ACTIVATIONS_ENV}): not one of {', '.join(ACTIVATIONS)}")
    return chosen


def row_bytes(kind: str, inner: int) -> int:
    """Bytes of one row of ``inner`` weights of ``kind`` in a GGUF file."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    return inner // block * size


# The forms of a GEMM entry point, as kernels/decoder_layers.c calls them (kernel_call)
LINEAR_ONE, LINEAR_ONE_X8, LINEAR_PARTS, LINEAR_PARTS_X8 = range(4)


def function_address(fn) -> int:
    """The address of a ctypes function (to pass to C code that calls it)."""
    return ctypes.cast(fn, ctypes.c_void_p).value


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _check_f32(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if t.dtype != torch.float32 or tuple(t.shape) != shape or t.device.type != "cpu":
        raise ValueError(f"{name}: expected a CPU float32 tensor of shape {shape}, got {t.dtype} {tuple(t.shape)}")


def _operands(x: torch.Tensor, inner: int, out_cols: int, out: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """x checked and contiguous, and the output to write ([n, out_cols], ``out`` if given, checked). Cheap
    checks only: this runs for every linear of every forward."""
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != inner or not x.is_cpu:
        raise ValueError(f"x: expected a CPU float32 tensor [n, {inner}], got {x.dtype} {tuple(x.shape)}")
    x = x.contiguous()
    n = x.shape[0]
    if out is None:
        return x, torch.empty(n, out_cols)
    if out.shape != (n, out_cols) or out.stride(1) != 1 or out.dtype != torch.float32:
        raise ValueError(f"out: expected float32 [{n}, {out_cols}] with unit column stride")
    return x, out


class QuantWeight:
    """One weight [out, inner] of a GGUF file as its raw blocks (see the module docstring)."""

    def __init__(self, kind: str | GGMLQuantizationType | int, raw: np.ndarray, out: int, inner: int,
                 isa: str | None = None, activations: str | None = None, scaled: bool = True):
        """``scaled``: with fp32 activations, read Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 blocks from a copy whose scales are
        fp32 (``self.scaled``) rather than from the file's fp16 ones: the same weights and bits, fewer
        instructions a block (False: the file's blocks, for comparing the two)."""
        self.kind = GGMLQuantizationType(kind).name if not isinstance(kind, str) else kind
        if self.kind not in KINDS:
            raise ValueError(f"GGUF type {self.kind} is not one the kernels read ({', '.join(KINDS)})")
        self.out, self.inner = int(out), int(inner)
        block = GGML_QUANT_SIZES[GGMLQuantizationType[self.kind]][0]
        if self.inner % CHUNK or self.inner % block:
            raise ValueError(f"a {self.kind} row of {self.inner} weights is not whole {max(block, CHUNK)}-weight blocks")
        raw = np.asarray(raw)
        raw = raw.view(np.uint8) if raw.ndim == 2 and raw.strides[1] == raw.itemsize else raw
        self.row_bytes = row_bytes(self.kind, self.inner)
        if raw.ndim == 1 and raw.nbytes == self.out * self.row_bytes:
            raw = raw.view(np.uint8).reshape(self.out, self.row_bytes)
        if raw.shape != (self.out, self.row_bytes) or raw.strides[1] != 1:
            raise ValueError(f"{self.kind} [{self.out}, {self.inner}]: raw blocks must be [{self.out}, "
                             f"{self.row_bytes}] bytes with contiguous rows, got {raw.shape} {raw.dtype}")
        self.raw = raw                                   # kept: the data (or the file mapping) it views
        self._type = int(GGMLQuantizationType[self.kind])
        self._kernels = native.kernels(isa)
        self.isa, self._isa_asked = self._kernels.isa, isa      # asked None: the x8 GEMM may be picked (x8_pick)
        self._w, self._ldw = raw.ctypes.data, raw.strides[0]
        asked = activation_mode(activations)        # 'auto' unsettled (a weight loaded on its own): fp32
        self.activations = "int8" if asked == "int8" and self.kind in INT8_KINDS else "fp32"
        self._gemm = self._kernels.gemm_q8 if self.activations == "int8" else self._kernels.gemm
        self.x8 = None            # the x8 copy (int8, X8_KINDS, out % 8 == 0, an x86 path): same bits, faster
        if (self.activations == "int8" and self.kind in X8_KINDS and self.out % 8 == 0
                and self._kernels.gemm_q8x8 is not None):
            self.x8 = np.empty(self._kernels.q8x8_bytes(self._type, self.out, self.inner), dtype=np.uint8)
            if self._kernels.pack_q8x8(self._type, self._w, self._ldw, self.out, self.inner, self.x8.ctypes.data,
                                       torch.get_num_threads()):
                raise RuntimeError(f"cannot interleave {self.kind} [{self.out}, {self.inner}]")
        self.scaled = None        # the fp32-scale copy (fp32 activations, SCALED_KINDS): same bits, fewer instructions
        if scaled and self.activations == "fp32" and self.kind in SCALED_KINDS:
            self.scaled = np.empty((self.out, self._kernels.scaled_row_bytes(self._type, self.inner)), dtype=np.uint8)
            if self._kernels.repack_scaled(self._type, self._w, self._ldw, self.out, self.inner,
                                           self.scaled.ctypes.data, torch.get_num_threads()):
                raise RuntimeError(f"cannot widen the scales of {self.kind} [{self.out}, {self.inner}]")
            self._type += SCALED
            self._w, self._ldw = self.scaled.ctypes.data, self.scaled.strides[0]

    @property
    def nbytes(self) -> int:
        return self.out * self.row_bytes

    @property
    def copied(self) -> bool:
        """Whether the kernels read a copy (x8 or fp32 scales), not the file's blocks: their pages may be released."""
        return self.x8 is not None or self.scaled is not None

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """x [n, inner] fp32 -> x W^T + bias [n, out] (bias: [out] fp32 contiguous, or None). ``out``: a tensor
        [n, out] to write into, whose rows may be strided (a column slice of a wider output)."""
        x, y = _operands(x, self.inner, self.out, out)
        n = x.shape[0]
        if bias is not None and (bias.dtype != torch.float32 or bias.shape != (self.out,) or not bias.is_contiguous()):
            raise ValueError(f"bias: expected a contiguous float32 tensor [{self.out}]")
        if self.x8 is not None:
            rc = self._kernels.gemm_q8x8(self._type, x.data_ptr(), n, self.inner, self.x8.ctypes.data, self.out,
                                         _ptr(bias), y.data_ptr(), y.stride(0), torch.get_num_threads())
        else:
            rc = self._gemm(self._type, x.data_ptr(), n, self.inner, self._w, self._ldw, self.out, _ptr(bias),
                            y.data_ptr(), y.stride(0), torch.get_num_threads())
        if rc:
            raise RuntimeError(f"the {self.isa} GEMM refused {self.kind} [{self.out}, {self.inner}]")
        return y

    def kernel_call(self) -> dict:
        """The call ``matmul`` makes, for C callers (native_layers.py): the entry point's form and address and
        its weight arguments (the fields of kernels/decoder_layers.c's tq_linear)."""
        if self.x8 is not None:
            return dict(form=LINEAR_ONE_X8, kind=self._type, parts=1, out=self.out, inner=self.inner,
                        fn=function_address(self._kernels.gemm_q8x8), w=self.x8.ctypes.data)
        return dict(form=LINEAR_ONE, kind=self._type, parts=1, out=self.out, inner=self.inner,
                    fn=function_address(self._gemm), w=self._w, ldw=self._ldw)

    def rows(self, ids: Sequence[int] | np.ndarray | torch.Tensor | None) -> torch.Tensor:
        """The exact fp32 weights of rows ``ids`` [len(ids), inner] (None: every row)."""
        if ids is None:
            index, n = None, self.out
        else:
            index = np.ascontiguousarray(np.asarray(ids, dtype=np.int64).reshape(-1))
            n = len(index)
            if n and (index.min() < 0 or index.max() >= self.out):
                raise IndexError(f"row ids must be in [0, {self.out})")
        y = torch.empty(n, self.inner)
        at = None if index is None else index.ctypes.data
        if self.x8 is not None:                          # the copy (so is ``scaled``): the file's pages may be released
            rc = self._kernels.dequantize_rows_q8x8(self._type, self.x8.ctypes.data, self.inner, at, n, y.data_ptr(),
                                                    torch.get_num_threads())
        else:
            rc = self._kernels.dequantize_rows(self._type, self._w, self._ldw, at, n, self.inner, y.data_ptr(),
                                               torch.get_num_threads())
        if rc:
            raise RuntimeError(f"cannot dequantize {self.kind} [{self.out}, {self.inner}]")
        return y

    def dequantize(self) -> torch.Tensor:
        """The fp32 weight [out, inner] the blocks stand for (gguf-py's values, bit for bit)."""
        return self.rows(None)

    def take(self, order: Sequence[int] | np.ndarray) -> "QuantWeight":
        """The weight whose row i is this one's row order[i] (a copy of those blocks)."""
        return QuantWeight(self.kind, self.raw[np.asarray(order)], len(order), self.inner, self._isa_asked,
                           self.activations)

    @staticmethod
    def cat(parts: Sequence["QuantWeight"]) -> "QuantWeight":
        """The weight whose rows are ``parts``' rows in order (merged q/k/v, gate/up): a copy of their blocks."""
        kind, inner = parts[0].kind, parts[0].inner
        if any(p.kind != kind or p.inner != inner for p in parts):
            raise ValueError("cannot merge GGUF weights of different types or widths")
        if len({p.activations for p in parts}) > 1:
            raise ValueError("cannot merge GGUF weights of different activation arithmetic")
        return QuantWeight(kind, np.concatenate([p.raw for p in parts]), sum(p.out for p in parts), inner,
                           parts[0]._isa_asked, parts[0].activations)

    def __repr__(self) -> str:
        return (f"QuantWeight({self.kind}, [{self.out}, {self.inner}], {self.nbytes / 1e6:.1f} MB, {self.isa}, "
                f"{self.activations} activations)")


class SideBySide:
    """Weights of one input side by side, as one weight [sum of outs, inner] read where each lies (q, k and v;
    gate and up): one kernel call (``gemm_parts``) instead of one per weight, every column bit-identical to
    its own weight's ``matmul``. No copy of the blocks (``QuantWeight.cat`` copies)."""

    MAX_PARTS = 8                         # the kernel's bound (gemm_dispatch.h)

    @classmethod
    def accepts(cls, parts: Sequence[QuantWeight]) -> bool:
        """1 to MAX_PARTS weights of one width, one ISA and one activation arithmetic."""
        return 1 <= len(parts) <= cls.MAX_PARTS and len({(p.inner, p.isa, p.activations, p._kernels.picked)
                                                         for p in parts}) == 1

    def __init__(self, parts: Sequence[QuantWeight]):
        if not self.accepts(parts):
            raise ValueError(f"side by side: 1 to {self.MAX_PARTS} weights of one width, ISA and activation arithmetic")
        n = len(parts)
        self.parts, self.inner, self.out = list(parts), parts[0].inner, sum(p.out for p in parts)
        self._kernels = parts[0]._kernels
        kinds, outs = (ctypes.c_int * n)(*(p._type for p in parts)), (ctypes.c_int64 * n)(*(p.out for p in parts))
        self._x8 = all(p.x8 is not None for p in parts)
        if self._x8:
            self._gemm_parts = self._kernels.gemm_parts_q8x8
            self._arrays = (kinds, (ctypes.c_void_p * n)(*(p.x8.ctypes.data for p in parts)), outs)
        else:
            self._gemm_parts = (self._kernels.gemm_parts_q8 if parts[0].activations == "int8"
                                else self._kernels.gemm_parts)
            self._arrays = (kinds, (ctypes.c_void_p * n)(*(p._w for p in parts)),
                            (ctypes.c_int64 * n)(*(p._ldw for p in parts)), outs)
        self._args = (n, *(ctypes.addressof(a) for a in self._arrays))

    def matmul(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """x [n, inner] fp32 -> [n, out]: each part's x W^T in its own columns (``out``: as QuantWeight.matmul)."""
        x, y = _operands(x, self.inner, self.out, out)
        n = x.shape[0]
        if self._gemm_parts(*self._args, x.data_ptr(), n, self.inner, y.data_ptr(), y.stride(0),
                                    torch.get_num_threads()):
            raise RuntimeError(f"the {self._kernels.isa} GEMM refused " + ", ".join(p.kind for p in self.parts))
        return y

    def kernel_call(self) -> dict:
        """The call ``matmul`` makes, for C callers (as QuantWeight.kernel_call; the arrays live as long as this)."""
        kinds, ws, *rest = (ctypes.addressof(a) for a in self._arrays)
        call = dict(parts=len(self.parts), fn=function_address(self._gemm_parts), w=ws, out=self.out,
                    inner=self.inner, kinds=kinds)
        if self._x8:                                  # (kinds, x8 copies, outs)
            return dict(call, form=LINEAR_PARTS_X8, outs=rest[0])
        return dict(call, form=LINEAR_PARTS, ldws=rest[0], outs=rest[1])      # (kinds, blocks, row bytes, outs)


class Ops:
    """The decoder layer's attention and row-wise glue on CPU float32 tensors (rows exact on every ISA).
    Shapes: n rows (tokens at positions start..start+n-1), H heads, KV key/value heads, D head size."""

    def __init__(self, isa: str | None = None):
        self._k = native.kernels(isa)
        self.isa = self._k.isa

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: int, scale: float,
                  window: int = 0, out: torch.Tensor | None = None) -> torch.Tensor:
        """q [n, H, D] (q.stride(2) == 1, q.stride(1) == D; any row stride, e.g. a slice of the qkv output);
        k_cache, v_cache [KV, capacity, D] contiguous (one layer; positions 0..start+n-1 written). Row i attends
        to positions ..start+i, the last ``window`` of them (0: all). Returns out [n, H * D]."""
        n, heads, d = q.shape
        kv_heads, cap = k_cache.shape[:2]
        if q.stride(2) != 1 or q.stride(1) != d or q.dtype != torch.float32:
            raise ValueError("q: float32 [n, H, D] with contiguous heads")
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            _check_f32(name, t, (kv_heads, cap, d))
            if not t.is_contiguous():
                raise ValueError(f"{name} must be contiguous")
        if heads % kv_heads or start + n > cap:
            raise ValueError(f"{heads} heads over {kv_heads} KV heads, positions up to {start + n} of {cap}")
        out = torch.empty(n, heads * d) if out is None else out
        _check_f32("out", out, (n, heads * d))
        self._k.attention(q.data_ptr(), q.stride(0), n, heads, kv_heads, d, k_cache.data_ptr(), v_cache.data_ptr(),
                          cap, start, window, scale, out.data_ptr(), torch.get_num_threads())
        return out

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                     out: torch.Tensor | None = None) -> torch.Tensor:
        """x [n, dim] += residual (None: no add), in place; returns weight * RMSNorm(x) [n, dim]."""
        n, dim = x.shape
        if not x.is_contiguous():
            raise ValueError("x must be contiguous (it is updated in place)")
        _check_f32("x", x, (n, dim))
        if residual is not None:
            _check_f32("residual", residual, (n, dim))
            residual = residual.contiguous()
        _check_f32("weight", weight, (dim,))
        out = torch.empty(n, dim) if out is None else out
        _check_f32("out", out, (n, dim))
        weight = weight.contiguous()          # locals: a temporary copy must outlive the call
        self._k.add_rms_norm(x.data_ptr(), _ptr(residual), n, dim, weight.data_ptr(), eps, out.data_ptr())
        return out

    def head_rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm of each head vector of x [n, heads, D] in place (x.stride(2) == 1, x.stride(1) == D; any row
        stride: the q or k part of a qkv output); weight [D]. Returns x."""
        n, heads, d = x.shape
        if x.stride(2) != 1 or x.stride(1) != d or x.dtype != torch.float32:
            raise ValueError("x: float32 [n, heads, D] with contiguous heads")
        _check_f32("weight", weight, (d,))
        weight = weight.contiguous()
        self._k.head_rms_norm(x.data_ptr(), n, x.stride(0), heads, d, weight.data_ptr(), eps)
        return x

    def rope_store(self, qkv: torch.Tensor, heads: int, kv_heads: int, cos: torch.Tensor, sin: torch.Tensor,
                   k_cache: torch.Tensor, v_cache: torch.Tensor, start: int, interleaved: bool = False,
                   q_out: torch.Tensor | None = None) -> torch.Tensor:
        """qkv [n, (H + 2 KV) D] contiguous (q, k, v heads of each row); cos/sin [n, D] of positions
        start..start+n-1 (transformers' rotary table). Writes rope(k) and v into k_cache/v_cache [KV, capacity, D]
        at those positions and returns rope(q) [n, H * D]. ``interleaved``: pairs (2j, 2j + 1), the q/k row
        order of a GGUF Llama file; else (j, j + D/2), transformers' order."""
        n = qkv.shape[0]
        kv, cap, d = k_cache.shape
        _check_f32("qkv", qkv, (n, (heads + 2 * kv_heads) * d))
        for name, t in (("cos", cos), ("sin", sin)):
            _check_f32(name, t, (n, d))
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            _check_f32(name, t, (kv_heads, cap, d))
            if not t.is_contiguous():
                raise ValueError(f"{name} must be contiguous")
        if start + n > cap:
            raise ValueError(f"positions up to {start + n} exceed the cache's {cap}")
        q_out = torch.empty(n, heads * d) if q_out is None else q_out
        _check_f32("q_out", q_out, (n, heads * d))
        qkv, cos, sin = qkv.contiguous(), cos.contiguous(), sin.contiguous()
        self._k.rope_store(qkv.data_ptr(), n, heads, kv_heads, d, cos.data_ptr(), sin.data_ptr(), k_cache.data_ptr(),
                           v_cache.data_ptr(), cap, start, q_out.data_ptr(), int(interleaved))
        return q_out

    def _gated(self, fn, gate_up: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        n, two = gate_up.shape
        _check_f32("gate_up", gate_up, (n, two))
        out = torch.empty(n, two // 2) if out is None else out
        _check_f32("out", out, (n, two // 2))
        gate_up = gate_up.contiguous()
        fn(gate_up.data_ptr(), n, two // 2, out.data_ptr())
        return out

    def silu_mul(self, gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """gate_up [n, 2 I] = [gate, up] of each row -> silu(gate) * up [n, I] (Llama, Qwen, Mistral MLPs)."""
        return self._gated(self._k.silu_mul, gate_up, out)

    def gelu_tanh_mul(self, gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """gate_up [n, 2 I] -> gelu_tanh(gate) * up [n, I] (Gemma's gelu_pytorch_tanh MLP)."""
        return self._gated(self._k.gelu_tanh_mul, gate_up, out)
