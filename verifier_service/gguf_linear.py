"""Linear layers that read the target's GGUF blocks as stored instead of fp32 copies.

A Q4_1 GGUF target is dequantized by transformers into fp32 weights: 538 MB for SmolLM2-135M, read once
per forward. The same weights are 96 MB in the file (Q4_1 blocks: 0.625 bytes a weight; the tied
embedding / head in Q8_0: 1.0625). ``quant.QuantWeight`` multiplies by the blocks directly (the C kernels
of ``native``, on the ISA it picks), rebuilding each weight in registers with gguf-py's own arithmetic, so
the weights are bit for bit the model's and only the summation order differs from another GEMM (as between
MKL and oneDNN). Every row of a block runs the same code: a row's result does not depend on the block width
or the thread count.

Pieces:
  * ``GgufWeights``: the file's 2-D tensors of the kinds the kernels read (``quant.KINDS``), and
    ``rows_for(weight, names)``: the blocks of a model weight, found by comparing dequantized rows with the
    model's (transformers permutes q/k rows for rope: the permutation is recovered, not assumed), or None
    when they are not the same numbers.
  * ``GgufLinear``: an ``nn.Module`` computing F.linear(x, weight, bias) from the blocks; inputs of more than
    ``WIDE_ROWS`` rows (prefill chunks, compute-bound) go to the fp32 layer it replaced.

Measured on the 2-core AMD EPYC (AVX-512), all 211 linears of SmolLM2-135M: width 1/2/3/5/8 in 11.0/14.0/
16.2/21.9/29.6 ms against oneDNN's 18.5/19.0/19.8/20.3/25.0 on 1 thread, 6.7/8.3/10.1/13.0/16.6 against
15.2/16.4/13.0/13.6/16.2 on 2 (the extra rows are FMA-bound: 2.7 ms a row on 1 thread, ~100 GFLOPS).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from verifier_service.quant import KINDS, QuantWeight

Q4_1, Q8_0 = "Q4_1", "Q8_0"
Packed = QuantWeight      # the name the static decoder uses for one weight's blocks


# ---- the file's blocks -----------------------------------------------------------------------------
class GgufWeights:
    """The 2-D tensors of a GGUF file that the kernels read (memory-mapped: the reader stays open)."""

    def __init__(self, path: str | os.PathLike):
        import gguf

        self.path = Path(path)
        self._reader = gguf.GGUFReader(str(self.path))
        self._tensors = {}
        for t in self._reader.tensors:
            kind = t.tensor_type.name
            if kind in KINDS and len(t.shape) == 2:
                inner, out = (int(s) for s in t.shape)                  # GGUF lists [in, out]
                self._tensors[t.name] = (kind, out, inner, t.data)

    def rows_for(self, weight: torch.Tensor, name: str) -> tuple[QuantWeight | None, str]:
        """The blocks of ``weight`` [out, in] from tensor ``name``, rows in the model's order;
        (None, why) when the file has no such tensor or its numbers are not the weight's."""
        if name not in self._tensors:
            return None, f"{name} is not a tensor of {self.path.name} the kernels read ({', '.join(KINDS)})"
        kind, out, inner, raw = self._tensors[name]
        if (out, inner) != tuple(weight.shape):
            return None, f"{name} is {out}x{inner}, the model's weight {tuple(weight.shape)}"
        try:
            packed = QuantWeight(kind, raw, out, inner)
        except ValueError as e:
            return None, f"{name}: {e}"
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
        return packed.take(order), ""


# ---- the module ------------------------------------------------------------------------------------
WIDE_ROWS = 32   # more rows than this (prefill chunks): the fp32 weight's GEMM, compute-bound, where
                 # MKL/oneDNN beat this kernel (a 256-token chunk: 2.7x the time-to-first-token); a
                 # verify block or plain step never has that many rows (static_decoder.ROW_BY_ROW_MAX)


class GgufLinear(nn.Module):
    """F.linear(x, weight, bias) computed from ``packed`` (the same weight, as GGUF blocks). x [n, in] fp32.
    ``wide``: the module that takes inputs of more than WIDE_ROWS rows (the layer it replaced), or None."""

    def __init__(self, packed: QuantWeight, bias: torch.Tensor | None = None, wide: nn.Module | None = None):
        super().__init__()
        self.wide = wide
        self.packed = packed
        self.in_features, self.out_features = packed.inner, packed.out
        self.bias = None if bias is None else bias.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > WIDE_ROWS and self.wide is not None:
            return self.wide(x)
        return self.packed.matmul(x, self.bias)

    def extra_repr(self) -> str:
        p = self.packed
        return f"{p.kind}, in={self.in_features}, out={self.out_features}, {p.nbytes / 1e6:.1f} MB, {p.isa}"
