"""Linear layers that read the target's GGUF blocks as stored instead of fp32 copies (issue 14).

A Q4_1 GGUF target is dequantized by transformers into fp32 weights: 538 MB for SmolLM2-135M, read once
per forward. The same weights are 96 MB in the file (Q4_1 blocks: 0.625 bytes a weight; the tied
embedding / head in Q8_0: 1.0625). ``gguf_gemm.c`` multiplies by the blocks directly, rebuilding each
weight in registers with gguf-py's own arithmetic, so the weights are bit for bit the model's and only
the summation order differs from another GEMM (as between MKL and oneDNN). Every row of a block runs
the same code: a row's result does not depend on the block width or the thread count.

Pieces:
  * ``GgufWeights``: the file's tensors by name, and ``rows_for(weight, names)``: the packed blocks of a
    model weight, found by comparing dequantized rows with the model's (transformers permutes q/k rows
    for rope: the permutation is recovered, not assumed), or None when they are not the same numbers.
  * ``GgufLinear``: an ``nn.Module`` computing F.linear(x, weight, bias) from the packed blocks; inputs of
    more than ``WIDE_ROWS`` rows (prefill chunks, compute-bound) go to the fp32 layer it replaced.

Measured on the 2-core AMD EPYC, all 211 linears of SmolLM2-135M: width 1/2/3/5/8 in 11.0/14.0/16.2/21.9/
29.6 ms against oneDNN's 18.5/19.0/19.8/20.3/25.0 on 1 thread, 6.7/8.3/10.1/13.0/16.6 against
15.2/16.4/13.0/13.6/16.2 on 2 (the extra rows are FMA-bound: 2.7 ms a row on 1 thread, ~100 GFLOPS).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from verifier_service import native

Q4_1, Q8_0 = "Q4_1", "Q8_0"
BLOCK = 32


# ---- the file's blocks -----------------------------------------------------------------------------
class Packed:
    """One weight [out, in] as kernel arrays (see gguf_gemm.c): ``kind`` Q4_1 (d, m, qs) or Q8_0 (d, qs)."""

    def __init__(self, kind: str, out: int, inner: int, d: np.ndarray, m: np.ndarray | None, qs: np.ndarray):
        self.kind, self.out, self.inner = kind, int(out), int(inner)
        self.d = torch.from_numpy(np.ascontiguousarray(d, dtype=np.float32))
        self.m = None if m is None else torch.from_numpy(np.ascontiguousarray(m, dtype=np.float32))
        self.qs = torch.from_numpy(np.ascontiguousarray(qs))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.d, self.m, self.qs) if t is not None)

    def dequantize(self) -> torch.Tensor:
        """The fp32 weight [out, in] the blocks stand for (gguf-py's arithmetic, for checks)."""
        nb = self.inner // BLOCK
        d = self.d.view(self.out, nb, 1)
        if self.kind == Q8_0:
            return (self.qs.view(self.out, nb, BLOCK).float() * d).view(self.out, self.inner)
        q = self.qs.view(self.out, nb, 16)
        q = torch.cat([q & 0x0F, q >> 4], dim=2).float()                           # [out, nb, 32]
        return (d * q + self.m.view(self.out, nb, 1)).view(self.out, self.inner)

    @staticmethod
    def cat(parts: Sequence["Packed"]) -> "Packed":
        """The weight whose rows are ``parts``' rows in order (merged q/k/v, gate/up)."""
        kind, inner = parts[0].kind, parts[0].inner
        if any(p.kind != kind or p.inner != inner for p in parts):
            raise ValueError("cannot merge GGUF weights of different types or widths")
        m = None if kind == Q8_0 else np.concatenate([p.m.numpy() for p in parts])
        return Packed(kind, sum(p.out for p in parts), inner, np.concatenate([p.d.numpy() for p in parts]), m,
                      np.concatenate([p.qs.numpy() for p in parts]))


def _split_blocks(kind: str, raw: np.ndarray, out: int, inner: int) -> Packed:
    """raw [out, bytes a row] (the file's layout) -> kernel arrays."""
    nb = inner // BLOCK
    blocks = raw.reshape(out, nb, -1)
    d = blocks[:, :, 0:2].copy().view(np.float16).astype(np.float32).reshape(out * nb)
    if kind == Q4_1:
        m = blocks[:, :, 2:4].copy().view(np.float16).astype(np.float32).reshape(out * nb)
        return Packed(kind, out, inner, d, m, blocks[:, :, 4:20].reshape(out * nb * 16))
    return Packed(kind, out, inner, d, None, blocks[:, :, 2:34].copy().view(np.int8).reshape(out * nb * 32))


class GgufWeights:
    """The quantized tensors of a GGUF file (Q4_1 and Q8_0; others are left to the fp32 GEMMs)."""

    def __init__(self, path: str | os.PathLike):
        import gguf

        self.path = Path(path)
        reader = gguf.GGUFReader(str(self.path))
        self._tensors = {}
        for t in reader.tensors:
            kind = t.tensor_type.name
            if kind in (Q4_1, Q8_0) and len(t.shape) == 2:
                inner, out = (int(s) for s in t.shape)                  # GGUF lists [in, out]
                self._tensors[t.name] = (kind, out, inner, np.asarray(t.data))

    def rows_for(self, weight: torch.Tensor, name: str) -> tuple[Packed | None, str]:
        """The packed blocks of ``weight`` [out, in] from tensor ``name``, rows in the model's order;
        (None, why) when the file has no such tensor or its numbers are not the weight's."""
        if name not in self._tensors:
            return None, f"{name} is not a Q4_1/Q8_0 tensor of {self.path.name}"
        kind, out, inner, raw = self._tensors[name]
        if (out, inner) != tuple(weight.shape) or inner % BLOCK:
            return None, f"{name} is {out}x{inner}, the model's weight {tuple(weight.shape)}"
        packed = _split_blocks(kind, raw, out, inner)
        values = packed.dequantize()
        w = weight.detach().float().contiguous()
        if torch.equal(values, w):
            return packed, ""
        # transformers permutes some rows (q/k for rope): find each model row among the file's rows (equal
        # bytes: the reordered blocks dequantize to the model's weight exactly)
        index = {values[i].numpy().tobytes(): i for i in range(out)}
        order = [index.get(w[i].numpy().tobytes()) for i in range(out)]
        if any(i is None for i in order):
            return None, f"{name}'s dequantized rows are not the model's weight"
        return _split_blocks(kind, raw.reshape(out, -1)[np.asarray(order)], out, inner), ""


# ---- the module ------------------------------------------------------------------------------------
WIDE_ROWS = 32   # more rows than this (prefill chunks): the fp32 weight's GEMM, compute-bound, where
                 # MKL/oneDNN beat this kernel (a 256-token chunk: 2.7x the time-to-first-token); a
                 # verify block or plain step never has that many rows (static_decoder.ROW_BY_ROW_MAX)


class GgufLinear(nn.Module):
    """F.linear(x, weight, bias) computed from ``packed`` (the same weight, as GGUF blocks). x [n, in] fp32.
    ``wide``: the module that takes inputs of more than WIDE_ROWS rows (the layer it replaced), or None."""

    def __init__(self, packed: Packed, bias: torch.Tensor | None = None, wide: nn.Module | None = None):
        super().__init__()
        self.wide = wide
        lib = native.library()
        if lib is None:
            raise RuntimeError(f"the GGUF kernel is not available: {native.unavailable_reason()}")
        self._lib = lib
        self.packed = packed
        self.in_features, self.out_features = packed.inner, packed.out
        self.bias = None if bias is None else bias.detach().float().contiguous()
        p = packed
        self._d, self._qs = p.d.data_ptr(), p.qs.data_ptr()
        self._m = p.m.data_ptr() if p.m is not None else None
        self._b = self.bias.data_ptr() if self.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        if n > WIDE_ROWS and self.wide is not None:
            return self.wide(x)
        x = x.contiguous()
        y = torch.empty(n, self.out_features)
        threads = torch.get_num_threads()
        if self.packed.kind == Q4_1:
            self._lib.gguf_q4_1_gemm(x.data_ptr(), n, self.in_features, self._d, self._m, self._qs,
                                     self.out_features, self._b, y.data_ptr(), threads)
        else:
            self._lib.gguf_q8_0_gemm(x.data_ptr(), n, self.in_features, self._d, self._qs,
                                     self.out_features, self._b, y.data_ptr(), threads)
        return y

    def extra_repr(self) -> str:
        return f"{self.packed.kind}, in={self.in_features}, out={self.out_features}, {self.packed.nbytes / 1e6:.1f} MB"
