"""The target's forward, written once for every architecture in ``architecture``: a decoder-only transformer
over ``weights`` (GGUF blocks or fp32 tensors) and an op backend (``ops``: C kernels or torch), with a
static KV cache (``kv_cache.StaticKVCache``: rollback = move the length back).

  x = embed(ids) * embed_scale                                     [n, hidden]
  h = norm(x)
  per layer:
    qkv = W_qkv . h (+ bias)                                       one GEMM for q, k and v
    q, k = rope(norm_q(q), norm_k(k)); cache[start:start+n] = k, v  q/k norms where the model has them
    o = W_o . attention(q, cache)                                  per row (exact rows) or one masked call
    x += norm_post(o); h = norm(x)                                 the post norm where the model has one
    d = W_down . (act(gate) * up), [gate, up] = W_gate_up . h      SiLU or GELU-tanh
    x += norm_post(d); h = norm(x)                                 (the next layer's norm, or the final one)
  logits = W_head . h  (the last row only in prefill)

What differs between architectures is data (``DecoderSpec``: which norms, the activation, the window
and rope base of each layer, the embedding scale, biases), not a second copy of this loop.

Exact rows: blocks of up to ``ROW_BY_ROW_MAX`` rows attend row by row with the code a plain step runs,
and every other op is row-independent (the GEMMs: the C kernel on blocks or oneDNN on packed weights;
row-wise norms, rope, activations), so row i of a verify block is bit-identical to the plain step that
would have computed it: greedy speculative output equals plain decoding exactly. Prefill chunks (more
rows) use one masked SDPA call per layer and a compute-bound GEMM.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from verifier_service import fast_linear
from verifier_service.architecture import DecoderSpec
from verifier_service.kv_cache import StaticKVCache
from verifier_service.ops import TorchOps, rope_inv_freq, rope_tables
from verifier_service.weights import Weight

ROW_BY_ROW_MAX = 32           # blocks up to this many rows attend row by row (exact rows)


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor
    qkv: Weight
    o: Weight
    ffn_norm: torch.Tensor
    gate_up: Weight
    down: Weight
    qkv_bias: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None           # [head_dim], with spec.qk_norm
    k_norm: torch.Tensor | None = None
    post_attn_norm: torch.Tensor | None = None   # with spec.sandwich_norms
    post_ffn_norm: torch.Tensor | None = None


@dataclass
class DecoderWeights:
    embed: Weight
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    head: Weight

    def linears(self) -> list[Weight]:
        out = [w for layer in self.layers for w in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        return out + [self.head]

    def kinds(self) -> list[str]:
        return sorted({k for w in self.linears() + [self.embed] for k in w.kinds()})

    def nbytes(self) -> int:
        seen, total = set(), 0
        for w in self.linears() + [self.embed]:
            if id(w) not in seen:
                seen.add(id(w))
                total += w.nbytes
        return total


class _Modules(nn.Module):
    """The decoder's weights as one module tree, so ``fast_linear`` can pack and time the dense ones."""

    def __init__(self, weights: DecoderWeights):
        super().__init__()
        self.layers = nn.ModuleList(nn.ModuleList([layer.qkv, layer.o, layer.gate_up, layer.down])
                                    for layer in weights.layers)
        self.head = weights.head


class RopeTables:
    """cos/sin tables [positions, head_dim] (transformers' layout: the two halves repeat the same angles) per
    distinct (base, linear factor) of the layers; extended (doubling) as positions grow."""

    def __init__(self, spec: DecoderSpec, upto: int = 4096):
        self.spec = spec
        linear = spec.rope_linear or (1.0,) * spec.layers
        keys = list(zip(spec.rope_bases, linear))
        self.groups = sorted(set(keys))
        self.group_of = [self.groups.index(k) for k in keys]
        self._tables: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._have = 0
        self.extend(min(spec.context, upto))

    def frequencies(self, group: int) -> torch.Tensor:
        base, linear = self.groups[group]
        return rope_inv_freq(base, self.spec.head_dim, self.spec.rope_factors, linear)

    def extend(self, upto: int) -> None:
        if upto <= self._have:
            return
        upto = min(self.spec.context, max(upto, 2 * self._have))
        positions = torch.arange(upto)
        self._tables = [rope_tables(self.frequencies(g), positions) for g in range(len(self.groups))]
        self._have = upto

    def __call__(self, layer: int, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self._tables[self.group_of[layer]]
        return cos[start:start + n], sin[start:start + n]


class Decoder:
    """``Decoder(spec, weights, ops)``: ``forward(cache, ids, last_only)`` -> logits; ``new_cache()``."""

    def __init__(self, spec: DecoderSpec, weights: DecoderWeights, ops: TorchOps, *, exact_rows: bool = True,
                 gemm: str = "auto", widths: Sequence[int] = range(1, 10), rope: RopeTables | None = None):
        """``gemm``: the kernels for the dense (fp32) weights, as ``fast_linear.configure`` takes it ("auto"
        measures oneDNN against MKL; block weights always run their C kernel)."""
        self.spec, self.weights, self.ops = spec, weights, ops
        self.exact_rows = bool(exact_rows)
        self.rope = rope or RopeTables(spec)
        self.linears = _Modules(weights)
        self.gemm, self.gemm_note, self.gemm_choice = "blocks", "the file's blocks", None
        if any(isinstance(m, (nn.Linear, fast_linear.FastLinear)) for m in self.linears.modules()):
            self.gemm, self.gemm_note, self.gemm_choice = fast_linear.configure(self.linears, gemm, widths)

    @property
    def rows_independent(self) -> bool:
        """True when a row's logits cannot depend on the block width (one GEMM kernel at every width, exact rows)."""
        return self.exact_rows and (self.gemm_choice is None or self.gemm_choice.uniform)

    @property
    def max_length(self) -> int:
        return self.spec.context

    def describe(self) -> str:
        kernels = self.gemm if self.gemm_choice is None else self.gemm_choice.describe()
        rows = f"exact (row-wise attention, {self.ops.describe()})" if self.exact_rows else "batched"
        return f"decoder: {self.spec.describe()}; GEMMs {kernels}; rows {rows}"

    def new_cache(self) -> StaticKVCache:
        s = self.spec
        return StaticKVCache(s.layers, s.kv_heads, s.head_dim, s.context)

    def _row_by_row(self, n: int) -> bool:
        return n <= ROW_BY_ROW_MAX and (self.exact_rows or n == 1)

    @torch.inference_mode()
    def forward(self, cache: StaticKVCache, input_ids: Sequence[int], last_only: bool = False) -> torch.Tensor:
        """Feeds ``input_ids`` after the cache's ``length`` positions, appends their K/V, and returns logits
        [len(input_ids), vocab] (``last_only``: [1, vocab], the last row)."""
        s, w, ops = self.spec, self.weights, self.ops
        n, start = len(input_ids), cache.length
        cache.reserve(start + n)
        self.rope.extend(start + n)
        ids = torch.as_tensor(list(input_ids), dtype=torch.long)
        x = w.embed.rows(ids)                                                        # [n, hidden]
        if s.embed_scale != 1.0:
            x = x * torch.tensor(s.embed_scale, dtype=torch.float32)
        x = x.contiguous()
        h = torch.empty_like(x)
        ops.add_rms_norm(x, None, w.layers[0].attn_norm, s.norm_eps, h)
        attend = ops.attend_rows if self._row_by_row(n) else ops.attend_block
        for i, layer in enumerate(w.layers):
            qkv = layer.qkv.matmul(h)                                               # [n, (H + 2 KV) D]
            if layer.qkv_bias is not None:
                qkv += layer.qkv_bias
            cos, sin = self.rope(i, start, n)
            q = ops.rope_store(qkv, s.heads, s.kv_heads, s.head_dim, cos, sin, s.rope_layout, cache.kv[i], start,
                               layer.q_norm, layer.k_norm, s.norm_eps)             # [n, H, D]
            o = layer.o.matmul(attend(q, cache.kv[i], start, s.scale, s.windows[i]))
            if layer.post_attn_norm is not None:
                o = ops.rms_norm(o, layer.post_attn_norm, s.norm_eps)
            ops.add_rms_norm(x, o, layer.ffn_norm, s.norm_eps, h)                   # x += o; h = norm(x)
            down = layer.down.matmul(ops.gated(layer.gate_up.matmul(h), s.activation))
            if layer.post_ffn_norm is not None:
                down = ops.rms_norm(down, layer.post_ffn_norm, s.norm_eps)
            following = w.layers[i + 1].attn_norm if i + 1 < len(w.layers) else w.final_norm
            ops.add_rms_norm(x, down, following, s.norm_eps, h)                     # x += down; h = norm(x)
        cache.length = start + n
        return w.head.matmul(h[-1:] if last_only else h)

    def time_linears(self, widths: Sequence[int], repeats: int = 3) -> dict[int, float]:
        """Median ms of all linears at each width (random inputs)."""
        gen = torch.Generator().manual_seed(0)
        mods = self.weights.linears()
        inputs = {w: {m.inner: torch.randn(w, m.inner, generator=gen) for m in mods} for w in widths}
        samples: dict[int, list[float]] = {w: [] for w in widths}
        with torch.inference_mode():
            for _ in range(repeats):
                for w in widths:
                    t0 = time.perf_counter()
                    for m in mods:
                        m.matmul(inputs[w][m.inner])
                    samples[w].append((time.perf_counter() - t0) * 1e3)
        return {w: sorted(v)[len(v) // 2] for w, v in samples.items()}

