"""The head's argmax without every exact logit: what greedy verification needs from the head, at a fraction of
its cost.

A greedy round reads only the argmax of each row of logits (``acceptance.accept_greedy``), yet the head is the
widest weight of a small model and the largest of all with a big vocabulary: Gemma 3 270M's is 262 144 x 640
(178 MB of Q8_0, more than its 18 layers together), read at every step with fp32 activations. Here each row
of h first goes through a cheap pass (``kernels/head_bound.h``): h rounded to 16 bits, integer dot products
with the head's rows as stored, and for every logit a proven bound on its distance from the exact fp32 logit
the verifier's kernels compute. Only the rows whose upper bound reaches the best lower bound can hold the
argmax (a median of 1 of Gemma's 262 144 on real hidden states, at most 2: BENCHMARKS.md, thirty-second
session); those are then computed by the same exact kernel as the full head, on a copy of just their blocks,
and every other logit of the row is set to -inf.

So the row returned has the exact logit wherever it could be the largest and -inf elsewhere: its argmax, and
the first index among ties, is the full row's, bit for bit (the exact kernel's row result does not depend on
which other rows it computes: exact rows). Greedy output is unchanged; only the head's time is. Sampling,
coupled sampling and anything else that reads the distribution gets the full head (``Decoder._head``).

Where it applies: a Q8_0 head (the file's blocks or their fp32-scale copy) or a Q6_K one with fp32 activations, at most
``MAX_ROWS`` rows a call; the int8 arithmetic's head is already an int8 GEMM. A row holding a value that is not
finite falls back to the full head.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from verifier_service.quant import QuantWeight

MAX_ROWS = 8                   # kernels/head_bound.h: HB_MAX_ROWS
CAP = 4096                     # rows a thread may keep per row of h (more: the full head)
KINDS = ("Q8_0", "Q6_K")      # Q8_0: Gemma 3's tied head; Q6_K: the output of most Q4_K_M files


def applies(head) -> bool:
    """Whether ``head`` (a ``weights.BlockWeight``) can give its argmax this way."""
    blocks = getattr(head, "blocks", None)
    return (isinstance(blocks, QuantWeight) and blocks.kind in KINDS and blocks.activations == "fp32"
            and blocks.x8 is None)


def row_l1(blocks: QuantWeight, step: int = 1024) -> np.ndarray:
    """sum_j |w_oj| of each row of ``blocks``, the weights as the kernels rebuild them, as float32 rounded up:
    the bound's factor (kernels/head_bound.h). ``step`` rows at a time: a few MB of scratch, not a share of the
    head's fp32 size on top of the verifier's peak memory."""
    out = np.empty(blocks.out, dtype=np.float32)
    for o in range(0, blocks.out, step):
        ids = np.arange(o, min(o + step, blocks.out))
        exact = blocks.rows(ids).abs_().sum(dim=1, dtype=torch.float64).numpy()   # float64: exact enough
        f = exact.astype(np.float32)
        out[ids] = np.where(f < exact, np.nextafter(f, np.float32(np.inf)), f)
    return out


class GreedyHead:
    """``logits_into(h, out)``: rows [n, vocab] whose argmax is the exact head's (see the module docstring)."""

    def __init__(self, head):
        if not applies(head):
            raise ValueError(f"the greedy head takes a Q8_0 or Q6_K head with fp32 activations, not {head!r}")
        self.blocks: QuantWeight = head.blocks
        self._array = self.blocks.scaled if self.blocks.scaled is not None else self.blocks.raw
        self._kind = self.blocks._type                      # Q8_0 (or its fp32-scale form) or Q6_K
        self._kernels = self.blocks._kernels
        self.vocab, self.inner = self.blocks.out, self.blocks.inner
        self._buffers: dict[int, tuple[np.ndarray, np.ndarray]] = {}   # rows of h -> (candidates, counts)
        self.candidates = 0                                 # head rows computed exactly, summed over calls
        self.rows = 0

    @functools.cached_property
    def l1(self) -> np.ndarray:
        """[vocab] sum |w| of each head row, rounded up: made on first use (a second on a 128 k x 3 072 head),
        so a verifier with the greedy head off, or a reference decoder beside it, never pays for it."""
        return row_l1(self.blocks)

    def candidates_of(self, h: torch.Tensor) -> list[np.ndarray] | None:
        """For h [n, inner] (n <= MAX_ROWS): per row, the head rows that can hold its argmax (ascending), or None
        where the bound pass does not apply (a value not finite, or too many rows kept: then every logit)."""
        n = h.shape[0]
        h = h.contiguous()
        if n not in self._buffers:                          # kept: a call allocates nothing
            self._buffers[n] = (np.empty((n, CAP), dtype=np.int64), np.empty(n, dtype=np.int64))
        cand, count = self._buffers[n]
        rc = self._kernels.head_bound(self._kind, h.data_ptr(), n, self.inner, self._array.ctypes.data,
                                      self._array.strides[0], self.vocab, self.l1.ctypes.data, CAP,
                                      cand.ctypes.data, count.ctypes.data, max(1, min(64, torch.get_num_threads())))
        if rc in (-2, -3):
            return None
        if rc:
            raise RuntimeError(f"the head's bound kernel refused {self.blocks!r} (rc {rc})")
        return [cand[r, :count[r]] for r in range(n)]

    def exact(self, h: torch.Tensor, ids: np.ndarray) -> torch.Tensor:
        """The exact logits of rows ``ids`` for every row of h [n, inner]: [n, len(ids)], the full head's kernel on
        those rows' blocks (a row's result does not depend on which other rows a call computes: exact rows)."""
        rows = np.ascontiguousarray(self._array[ids])
        y = torch.empty(h.shape[0], len(ids))
        rc = self.blocks._gemm(self._kind, h.data_ptr(), h.shape[0], self.inner, rows.ctypes.data, rows.strides[0],
                               len(ids), None, y.data_ptr(), y.stride(0), 1)
        if rc:
            raise RuntimeError(f"the {self.blocks.isa} GEMM refused {self.blocks!r}")
        return y

    def logits_into(self, h: torch.Tensor, out: torch.Tensor) -> bool:
        """out [n, vocab] = rows whose argmax is the exact head's for h [n, inner]; False (out untouched) where
        it does not apply to these rows (too many, a value not finite, too many candidates): the caller then
        computes the full head. Every row gets the exact logits of every row's candidates (one call; each is
        that row's exact logit too) and -inf elsewhere."""
        n = h.shape[0]
        if n > MAX_ROWS or n < 1:
            return False
        h = h.contiguous()
        ids = self.candidates_of(h)
        if ids is None:
            return False
        union = ids[0] if n == 1 else np.unique(np.concatenate(ids))
        out.fill_(float("-inf"))
        out[:, torch.from_numpy(union)] = self.exact(h, union)
        self.candidates += len(union)
        self.rows += n
        return True
