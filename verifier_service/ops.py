"""The decoder's row-wise operations, behind one interface with two backends.

``TorchOps`` is the readable reference: every op in torch, for every architecture feature (both rope
layouts, q/k norms, sliding windows, SiLU and GELU-tanh). ``NativeOps`` runs what the C kernels cover
(``native``: residual add + RMSNorm, per-head RMSNorm, rope of either layout + KV store, SiLU and
GELU-tanh products, exact-rows attention, also over a sliding window) in C.

Every op treats each row on its own with the same code whatever the number of rows, so a token's row
in a verify block is bit-identical to the plain step that would have computed it. Attention comes in
two forms: ``attend_rows`` (each query row over its own causal prefix, the exact-rows path) and
``attend_block`` (one masked SDPA call, for prefill chunks).

Shapes: x, h [n, hidden]; qkv [n, (heads + 2 kv_heads) head_dim]; one layer's cache kv
[2, kv_heads, capacity, head_dim]; cos/sin [n, head_dim] as ``rope_tables`` builds them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from verifier_service import native
from verifier_service.architecture import GELU_TANH, HALVES, INTERLEAVED, SILU


def rope_tables(inv_freq: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [positions, head_dim] for frequencies ``inv_freq`` [head_dim / 2], as transformers builds
    them: angles [f0..f(d/2-1), f0..f(d/2-1)] (the rope of either layout reads them so)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]                     # [P, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().contiguous(), emb.sin().contiguous()


def rope_inv_freq(base: float, head_dim: int, factors=None, linear: float = 1.0) -> torch.Tensor:
    """transformers' default rope frequencies, divided by llama.cpp's per-frequency ``factors`` (Llama 3
    scaling) and the ``linear`` scaling factor where given."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if factors is not None:
        inv_freq = inv_freq / torch.tensor(factors, dtype=torch.float32)
    if linear != 1.0:
        inv_freq = inv_freq / linear
    return inv_freq


class TorchOps:
    name = "torch"

    def rms_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), w, eps)

    def add_rms_norm(self, x: torch.Tensor, y: torch.Tensor | None, w: torch.Tensor, eps: float,
                     h: torch.Tensor) -> None:
        """x += y (when given), then h = RMSNorm(x) * w; in place."""
        if y is not None:
            x.add_(y)
        h.copy_(self.rms_norm(x, w, eps))

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
        """x [n, heads, D] rotated: x * cos + rotate(x) * sin, with rotate pairing x[j] and x[j + D/2]
        (halves) or x[2j] and x[2j + 1] (interleaved, angle j); cos/sin [n, D] (``rope_tables``)."""
        half = x.shape[-1] // 2
        if layout == HALVES:
            rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        else:
            rotated = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
            cos, sin = cos[:, :half].repeat_interleave(2, dim=-1), sin[:, :half].repeat_interleave(2, dim=-1)
        return x * cos[:, None] + rotated * sin[:, None]

    def rope_store(self, qkv: torch.Tensor, heads: int, kv_heads: int, d: int, cos: torch.Tensor, sin: torch.Tensor,
                   layout: str, kv: torch.Tensor, start: int, q_norm: torch.Tensor | None,
                   k_norm: torch.Tensor | None, eps: float) -> torch.Tensor:
        """q [n, heads, D] = rope(norm(q)); kv[:, :, start:start + n] = rope(norm(k)), v. q/k norms per head
        when given."""
        n = qkv.shape[0]
        q = qkv[:, :heads * d].view(n, heads, d)
        k = qkv[:, heads * d:(heads + kv_heads) * d].view(n, kv_heads, d)
        v = qkv[:, (heads + kv_heads) * d:].view(n, kv_heads, d)
        if q_norm is not None:
            q, k = self.rms_norm(q, q_norm, eps), self.rms_norm(k, k_norm, eps)
        kv[0, :, start:start + n] = self.rope(k, cos, sin, layout).transpose(0, 1)
        kv[1, :, start:start + n] = v.transpose(0, 1)
        return self.rope(q, cos, sin, layout).contiguous()

    def gated(self, gate_up: torch.Tensor, activation: str) -> torch.Tensor:
        """act(gate) * up for gate_up [n, 2 I] = [gate, up]."""
        inner = gate_up.shape[1] // 2
        gate, up = gate_up[:, :inner], gate_up[:, inner:]
        if activation == SILU:
            return F.silu(gate) * up
        if activation == GELU_TANH:
            return F.gelu(gate, approximate="tanh") * up
        raise ValueError(f"unknown activation {activation!r}")

    def attend_rows(self, q: torch.Tensor, kv: torch.Tensor, start: int, scale: float, window: int) -> torch.Tensor:
        """Row i (position start + i) attends to keys max(0, p - window + 1)..p (window 0: from 0), with the
        code a width-1 step runs; q [n, heads, D] -> [n, heads * D]."""
        n, heads, d = q.shape
        kv_heads = kv.shape[1]
        qg = (q * scale).view(n, kv_heads, heads // kv_heads, d)                    # [n, KV, G, D]
        rows = []
        for i in range(n):
            p = start + i
            lo = max(0, p - window + 1) if window else 0
            keys, values = kv[0, :, lo:p + 1], kv[1, :, lo:p + 1]                     # [KV, m, D]
            scores = torch.bmm(qg[i], keys.transpose(1, 2))                          # [KV, G, m]
            rows.append(torch.bmm(torch.softmax(scores, dim=-1), values))           # [KV, G, D]
        return torch.stack(rows).reshape(n, heads * d)

    def attend_block(self, q: torch.Tensor, kv: torch.Tensor, start: int, scale: float, window: int) -> torch.Tensor:
        """All rows in one SDPA call, masked causally (and to the window) after ``start`` cached positions."""
        n, heads, d = q.shape
        total = start + n
        keys, values = kv[0, :, :total][None], kv[1, :, :total][None]                # [1, KV, total, D]
        mask = torch.ones(n, total, dtype=torch.bool).tril(diagonal=start)          # row i sees 0..start+i
        if window:
            mask &= ~torch.ones(n, total, dtype=torch.bool).tril(diagonal=start - window)
        out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys, values, attn_mask=mask, scale=scale,
                                             enable_gqa=heads != kv.shape[1])      # [1, H, n, D]
        return out[0].transpose(0, 1).reshape(n, heads * d)

    def describe(self) -> str:
        return "torch ops"


class NativeOps(TorchOps):
    """The C kernels of the ISA in use (``native.library()``: norms, both rope layouts + KV store, SiLU and
    GELU-tanh products, exact-rows attention with or without a window); ``TorchOps`` for inputs they do not
    take (a non-contiguous or odd-sized tensor)."""

    name = "native"

    def __init__(self, lib=None):
        self.lib = lib or native.library()
        if self.lib is None:
            raise RuntimeError(f"the C kernels are not available: {native.unavailable_reason()}")
        self.isa = self.lib.isa

    def add_rms_norm(self, x, y, w, eps, h) -> None:
        n, dim = x.shape
        self.lib.add_rms_norm(x.data_ptr(), None if y is None else y.contiguous().data_ptr(), n, dim, w.data_ptr(),
                              eps, h.data_ptr())

    def rms_norm(self, x, w, eps):
        if x.dim() != 2 or not x.is_contiguous():
            return super().rms_norm(x, w, eps)
        h = torch.empty_like(x)
        self.lib.add_rms_norm(x.data_ptr(), None, x.shape[0], x.shape[1], w.data_ptr(), eps, h.data_ptr())
        return h

    def rope_store(self, qkv, heads, kv_heads, d, cos, sin, layout, kv, start, q_norm, k_norm, eps):
        if d % 2 or not qkv.is_contiguous():
            return super().rope_store(qkv, heads, kv_heads, d, cos, sin, layout, kv, start, q_norm, k_norm, eps)
        n, row = qkv.shape
        if q_norm is not None:          # per-head norms of q and k in place, then rope + store
            self.lib.head_rms_norm(qkv.data_ptr(), n, row, heads, d, q_norm.data_ptr(), eps)
            self.lib.head_rms_norm(qkv.data_ptr() + heads * d * qkv.element_size(), n, row, kv_heads, d,
                                   k_norm.data_ptr(), eps)
        q = torch.empty(n, heads, d)
        plane = kv.shape[1] * kv.shape[2] * kv.shape[3]                               # KV * capacity * D
        base = kv.data_ptr()
        args = (qkv.data_ptr(), n, heads, kv_heads, d, cos.data_ptr(), sin.data_ptr(), base,
                base + plane * kv.element_size(), kv.shape[2], start, q.data_ptr())
        self.lib.rope_store(*args, interleaved=int(layout == INTERLEAVED))
        return q

    def gated_kernel(self, activation: str):
        """The C product act(gate) * up for ``activation`` (SiLU, GELU-tanh), or None."""
        return {SILU: self.lib.silu_mul, GELU_TANH: self.lib.gelu_tanh_mul}.get(activation)

    def gated(self, gate_up, activation):
        kernel = self.gated_kernel(activation)
        if kernel is None:
            return super().gated(gate_up, activation)
        n, width = gate_up.shape
        out = torch.empty(n, width // 2)
        kernel(gate_up.contiguous().data_ptr(), n, width // 2, out.data_ptr())
        return out

    def attend_rows(self, q, kv, start, scale, window):
        n, heads, d = q.shape
        if q.stride(2) != 1 or q.stride(1) != d:
            return super().attend_rows(q, kv, start, scale, window)
        out = torch.empty(n, heads * d)
        plane = kv.shape[1] * kv.shape[2] * kv.shape[3]
        base = kv.data_ptr()
        args = (q.data_ptr(), q.stride(0), n, heads, kv.shape[1], d, base, base + plane * kv.element_size(),
                kv.shape[2], start, scale, out.data_ptr(), torch.get_num_threads())
        self.lib.row_attention(*args, window=window)
        return out

    def describe(self) -> str:
        return f"C kernels ({self.isa})"


def backend(native_ops: bool = True) -> TorchOps:
    """NativeOps where the C kernels build here (and ``native_ops``), else TorchOps."""
    if native_ops and native.library() is not None:
        return NativeOps()
    return TorchOps()
