"""The decoder's weights behind one interface, whatever holds them: ``matmul(x)`` (y = x W^T, x [n, in] fp32 ->
[n, out]), ``rows(ids)`` (exact rows of W: the embedding lookup), ``nbytes``, ``kind``.

  * ``BlockWeight``: a GGUF tensor as its blocks, read where they lie in the file's memory map by the C
    kernels (``quant.QuantWeight``: F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K) for up to ``WIDE_ROWS`` rows: every row
    runs the same code, so a row's result does not depend on the block width. Wider inputs (prefill
    chunks, compute-bound) dequantize ``CHUNK_WEIGHTS`` weights at a time into a scratch tensor and run
    torch's GEMM on it: no fp32 copy of the weight is kept. With int8 activations, a weight with an x8 copy
    (Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q5_K/Q6_K) takes every width in the block kernels (their integer multiply-adds beat torch's
    fp32 GEMM on prefill chunks too: about 2x on Zen 3), so a prompt's linears are computed as its plain
    steps' are; the other kinds' kernels read 8 rows at a time from the file's layout, slower than torch there.
  * ``DenseWeight``: an fp32 tensor (a transformers model's weight, or a GGUF block type without a kernel
    here, dequantized once with gguf-py at load: correct, not memory-lean), multiplied through
    ``fast_linear`` (oneDNN on a packed copy, or MKL), chosen by ``fast_linear.configure``.
  * ``Concat``: the rows of several weights as one (q/k/v, gate/up): one call each, into one output.

``from_gguf(kind, raw, out, inner)`` picks the implementation for a tensor of the file (``raw``: its
[out, bytes a row] view of the map).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from verifier_service import native

WIDE_ROWS = 33                 # more rows than this: dequantize-and-GEMM (see the module docstring); 33 holds
                               # the longest verify block: 32 drafts (--max-block's default) + the pending row
CHUNK_WEIGHTS = 1 << 22        # weights dequantized at a time on that path (16 MB of fp32 scratch)


def dequantize(kind: str, raw: np.ndarray, out: int, inner: int) -> torch.Tensor:
    """gguf-py's dequantization of ``raw`` [rows, bytes a row] (the arithmetic transformers' GGUF loader uses)."""
    import gguf

    raw = np.asarray(raw)
    if kind not in ("F32", "F16"):
        raw = raw.view(np.uint8)
    values = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind])
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(out, inner)


class Weight(nn.Module):
    kind: str
    out: int
    inner: int

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        raise NotImplementedError

    def kinds(self) -> list[str]:
        return [self.kind]

    def kernel_call(self) -> dict | None:
        """The one C kernel call that multiplies blocks of up to WIDE_ROWS rows by this weight
        (``quant.QuantWeight.kernel_call``), or None where there is none (fp32 weights, mixed parts)."""
        return None


class DenseWeight(Weight):
    """An fp32 weight [out, in]; ``linear`` is an ``nn.Linear`` that ``fast_linear`` may replace by a FastLinear."""

    def __init__(self, weight: torch.Tensor, kind: str = "F32", bias: torch.Tensor | None = None):
        super().__init__()
        self.kind = kind
        self.out, self.inner = (int(s) for s in weight.shape)
        linear = nn.Linear(self.inner, self.out, bias=bias is not None, device="meta")
        linear.weight = nn.Parameter(weight.detach().float().contiguous(), requires_grad=False)
        if bias is not None:
            linear.bias = nn.Parameter(bias.detach().float().contiguous(), requires_grad=False)
        self.linear = linear

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.linear.weight)

    @property
    def nbytes(self) -> int:
        packed = getattr(self.linear, "packed", None)
        extra = 0 if packed is None else self.out * self.inner * 4
        return self.out * self.inner * 4 + extra


class BlockWeight(Weight):
    """A GGUF tensor as its blocks, read where they lie (``raw``: [out, bytes a row], a view of the file's
    map) by the C kernels (``quant.QuantWeight``)."""

    def __init__(self, kind: str, raw: np.ndarray, out: int, inner: int, gemm: bool = True):
        """``gemm``: False for a weight only looked up by rows (an untied embedding): no copy made for speed."""
        super().__init__()
        from verifier_service.quant import QuantWeight

        self.blocks = QuantWeight(kind, raw, out, inner, scaled=gemm)
        self.kind, self.out, self.inner = kind, int(out), int(inner)

    def matmul_into(self, x: torch.Tensor, y: torch.Tensor, column: int = 0) -> None:
        """y[:, column:column + out] = x W^T (y [n, any], written in place)."""
        n = x.shape[0]
        if n <= WIDE_ROWS or self.blocks.x8 is not None:    # int8 on 8 interleaved rows: faster than torch at any width
            self.blocks.matmul(x, out=y[:, column:column + self.out])
            return
        step = max(1, CHUNK_WEIGHTS // self.inner)
        for o0 in range(0, self.out, step):
            o1 = min(self.out, o0 + step)
            y[:, column + o0:column + o1] = x @ self.blocks.rows(np.arange(o0, o1)).t()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty(x.shape[0], self.out)
        self.matmul_into(x, y)
        return y

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.blocks.rows(ids.numpy())

    def kernel_call(self) -> dict:
        return self.blocks.kernel_call()

    @property
    def nbytes(self) -> int:
        return self.blocks.nbytes


class Concat(Weight):
    """The rows of ``parts`` in order, as one weight (their outputs side by side)."""

    def __init__(self, parts: Sequence[Weight]):
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.out, self.inner = sum(p.out for p in parts), parts[0].inner
        self.kind = "+".join(sorted({k for p in parts for k in p.kinds()}))
        self._side = None                 # GGUF blocks of one ISA: all parts in one kernel call (narrow blocks)
        if all(isinstance(p, BlockWeight) for p in parts):
            from verifier_service.quant import SideBySide

            blocks = [p.blocks for p in parts]
            self._side = SideBySide(blocks) if SideBySide.accepts(blocks) else None

    def kinds(self) -> list[str]:
        return [k for p in self.parts for k in p.kinds()]

    def kernel_call(self) -> dict | None:
        return None if self._side is None else self._side.kernel_call()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self._side is not None and x.shape[0] <= WIDE_ROWS:
            return self._side.matmul(x)
        y = torch.empty(x.shape[0], self.out)
        column = 0
        for p in self.parts:
            if isinstance(p, BlockWeight):
                p.matmul_into(x, y, column)
            else:
                y[:, column:column + p.out] = p.matmul(x)
            column += p.out
        return y

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("rows of a concatenated weight")

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


def concat(parts: Sequence[Weight]) -> Weight:
    """One weight with ``parts``' rows: merged into one kernel call where they are the same kind of thing."""
    if len(parts) == 1:
        return parts[0]
    if all(isinstance(p, DenseWeight) and p.linear.bias is None for p in parts):
        return DenseWeight(torch.cat([p.weight for p in parts]), "+".join(sorted({p.kind for p in parts})))
    return Concat(parts)


def has_kernel(kind: str, inner: int) -> bool:
    """Whether the C kernels read ``kind`` blocks here (rows of ``inner`` weights)."""
    from verifier_service.gguf_file import block_geometry
    from verifier_service.quant import CHUNK, KINDS

    return (kind in KINDS and native.library() is not None and inner % block_geometry(kind)[0] == 0
            and inner % CHUNK == 0)


def from_gguf(kind: str, raw: np.ndarray, out: int, inner: int, gemm: bool = True) -> Weight:
    """The weight for a GGUF tensor: its blocks where a kernel reads them here, else its values in fp32
    (``DenseWeight``, a copy: the caller may drop the map's pages). ``gemm``: False for a weight only looked up by
    rows (``BlockWeight``)."""
    if has_kernel(kind, inner):
        return BlockWeight(kind, raw, out, inner, gemm)
    if kind in ("F32", "F16"):
        return DenseWeight(torch.from_numpy(np.array(raw, dtype=np.float32)).reshape(out, inner), kind)
    return DenseWeight(dequantize(kind, raw, out, inner), kind)
