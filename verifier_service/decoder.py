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

``forward_blocks`` runs several sessions' blocks as ONE forward: the GEMMs over all their rows at once (the
weights are read once for every session), and per block, rope and the KV store at its own positions into
its own cache and attention over its own cache, with the code ``forward`` runs for that block alone. As
every op is row-independent, each session's logits are bit-identical to its forward alone, whoever shares
the forward, while the rows together stay within ``max_exact_rows`` (the GEMM kernel's exact-rows bound).
The C kernels on GGUF blocks are row-independent by construction; fp32 weights (oneDNN, MKL) are probed
(``batching_note``): oneDNN runs small row counts through other kernels on some shapes, and then a row's
result would depend on how many rows share its GEMM, so sessions are not batched.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from verifier_service import fast_linear, greedy_head, x8_pick
from verifier_service.architecture import DecoderSpec
from verifier_service.kv_cache import StaticKVCache
from verifier_service.native_layers import NativeLayers
from verifier_service.ops import TorchOps, rope_inv_freq, rope_tables
from verifier_service.weights import WIDE_ROWS, BlockWeight, DenseWeight, Weight

ROW_BY_ROW_MAX = WIDE_ROWS    # blocks up to this many rows attend row by row (exact rows): a whole verify block
BATCH_PROBE_ROWS = (1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 24)   # row counts compared with max_exact_rows


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

    @property
    def tables(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin) [positions, head_dim] contiguous, per group."""
        return self._tables

    def __call__(self, layer: int, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self._tables[self.group_of[layer]]
        return cos[start:start + n], sin[start:start + n]


class Decoder:
    """``Decoder(spec, weights, ops)``: ``forward(cache, ids, last_only)`` -> logits; ``new_cache()``."""

    def __init__(self, spec: DecoderSpec, weights: DecoderWeights, ops: TorchOps, *, exact_rows: bool = True,
                 gemm: str = "auto", widths: Sequence[int] = range(1, 10), rope: RopeTables | None = None,
                 native_layers: bool = True, activations_note: str = ""):
        """``gemm``: the kernels for the dense (fp32) weights, as ``fast_linear.configure`` takes it ("auto"
        measures oneDNN against MKL; block weights always run their C kernel). ``native_layers``: run the
        layer loop as one C call where the model allows (``native_layers.NativeLayers``; same bits).
        ``activations_note``: why the blocks' arithmetic is what it is, for the start-up line (``--activations
        auto``: ``activation_choice``)."""
        self.spec, self.weights, self.ops = spec, weights, ops
        self.exact_rows = bool(exact_rows)
        self.rope = rope or RopeTables(spec)
        self.linears = _Modules(weights)
        self.gemm, self.gemm_note, self.gemm_choice = "blocks", "the file's blocks", None
        arithmetic = {m.blocks.activations for m in self.linears.modules() if hasattr(m, "blocks")}
        if arithmetic:
            if "int8" in arithmetic:
                self.gemm_note += f", int8 activations (llama.cpp's arithmetic; {activations_note or '--activations'})"
            elif activations_note:
                self.gemm_note += f", fp32 activations ({activations_note})"
            else:
                self.gemm_note += ", fp32 activations"
        scaled = sorted({m.blocks.kind for m in self.linears.modules()
                         if hasattr(m, "blocks") and m.blocks.scaled is not None})
        if scaled:
            self.gemm_note += f"; {'/'.join(scaled)} with fp32 scales (the same weights, fewer instructions)"
        self.x8_choices = x8_pick.pick([m.blocks for m in self.linears.modules() if hasattr(m, "blocks")])
        if self.x8_choices:
            self.gemm_note += f"; int8 x8 GEMM measured: {x8_pick.describe(self.x8_choices)}"
        if any(isinstance(m, (nn.Linear, fast_linear.FastLinear)) for m in self.linears.modules()):
            self.gemm, self.gemm_note, self.gemm_choice = fast_linear.configure(self.linears, gemm, widths)
        # the head's argmax for greedy rows without every exact logit (verifier_service.greedy_head), at the
        # widths where measure_greedy_head found it faster than the full head
        self.greedy_head = greedy_head.GreedyHead(weights.head) if greedy_head.applies(weights.head) else None
        self.greedy_widths: frozenset[int] = frozenset()
        self.greedy_note = ("off (not a Q8_0 or Q6_K head with fp32 activations)" if self.greedy_head is None
                            else "not measured")
        self.native_layers, self.native_layers_note = None, "off (native_layers=False)"
        if native_layers:
            self.native_layers, self.native_layers_note = NativeLayers.build(spec, weights, ops, self.rope)

    @functools.cached_property
    def batching_note(self) -> str:
        """'' when blocks of several sessions may share a forward exactly (``forward_blocks``): exact rows, and
        every fp32 weight's rows the same at every row count up to ``max_exact_rows`` (probed once on random
        inputs); else why not."""
        if not self.exact_rows:
            return "rows not exact (--exact-rows off)"
        dense = {}
        for weight in self.weights.linears():
            for part in getattr(weight, "parts", [weight]):
                if isinstance(part, DenseWeight):
                    dense.setdefault((part.out, part.inner), part)
        gen = torch.Generator().manual_seed(0)
        top = self.max_exact_rows
        with torch.inference_mode():
            for weight in dense.values():
                x = torch.randn(top, weight.inner, generator=gen)
                full = weight.matmul(x)
                for rows in BATCH_PROBE_ROWS:
                    if rows < top and not torch.equal(weight.matmul(x[:rows].contiguous()), full[:rows]):
                        return (f"the fp32 GEMM of a [{weight.out}, {weight.inner}] weight gives {rows} rows other "
                                f"values than {top}")
        return ""

    @property
    def rows_independent(self) -> bool:
        """True when a row's logits cannot depend on the block width (one GEMM kernel at every width, exact rows)."""
        return self.exact_rows and (self.gemm_choice is None or self.gemm_choice.uniform)

    @property
    def max_exact_rows(self) -> int:
        """The most rows one forward may hold with every row computed as it would be alone: the row-by-row
        attention bound, which is the GGUF block kernel's (wider inputs dequantize and run torch's GEMM)."""
        return ROW_BY_ROW_MAX

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
    def forward(self, cache: StaticKVCache, input_ids: Sequence[int], last_only: bool = False,
                argmax_only: bool = False) -> torch.Tensor:
        """Feeds ``input_ids`` after the cache's ``length`` positions, appends their K/V, and returns logits
        [len(input_ids), vocab] (``last_only``: [1, vocab], the last row). ``argmax_only``: only each row's
        argmax will be read (greedy decoding): rows may then hold -inf wherever the logit cannot be the largest,
        the exact logit elsewhere (``verifier_service.greedy_head``; the argmax is the full row's, bit for bit)."""
        return self._forward([(cache, input_ids)], [1] if last_only else None, argmax_only)[0]

    @torch.inference_mode()
    def forward_blocks(self, blocks: Sequence[tuple[StaticKVCache, Sequence[int]]],
                       keep: Sequence[int | None] | None = None, argmax_only: bool = False) -> list[torch.Tensor]:
        """Several sessions' blocks in one forward: each ``(cache, input_ids)`` is fed after its own cache's
        ``length`` positions (its K/V appended there); returns each block's logits [len(input_ids), vocab],
        bit-identical to ``forward(cache, input_ids)`` alone while the rows together are at most
        ``max_exact_rows`` (see the module docstring). ``keep[i]`` (None: every row) limits block i's logits
        to its last ``keep[i]`` rows (0: none; a slice of a prompt being prefilled). ``argmax_only``: as
        ``forward``'s, for every block."""
        if len({id(cache) for cache, _ in blocks}) != len(blocks):
            raise ValueError("one block per cache in a forward")
        return self._forward(blocks, keep, argmax_only)

    def _forward(self, blocks: Sequence[tuple[StaticKVCache, Sequence[int]]],
                 keep: Sequence[int | None] | None = None, argmax_only: bool = False) -> list[torch.Tensor]:
        segments, h = self._hidden(blocks)
        s = self.spec
        if keep is not None and any(k is not None for k in keep):     # the head on the rows asked for only
            spans = [(first + n - (n if k is None else min(k, n)), first + n)
                     for (_, _, first, n, _), k in zip(segments, keep)]
            rows = [r for a, b in spans for r in range(a, b)]
            logits = self._head(h[rows], argmax_only) if rows else h.new_empty(0, s.vocab)
            out, at = [], 0
            for a, b in spans:
                out.append(logits[at:at + b - a])
                at += b - a
            return out
        logits = self._head(h, argmax_only)
        return [logits[first:first + n] for _, _, first, n, _ in segments]

    def _hidden(self, blocks: Sequence[tuple[StaticKVCache, Sequence[int]]]) -> tuple[list, torch.Tensor]:
        """The layers over every block's rows (K/V appended to each cache): (the blocks' segments, h [rows, hidden],
        the final norm of the residual stream, what the head multiplies)."""
        s, w, ops = self.spec, self.weights, self.ops
        segments = []                           # (cache, first position, first row, rows, attention) a block
        row = 0
        for cache, input_ids in blocks:
            n, start = len(input_ids), cache.length
            cache.reserve(start + n)
            self.rope.extend(start + n)
            segments.append((cache, start, row, n, ops.attend_rows if self._row_by_row(n) else ops.attend_block))
            row += n
        ids = torch.as_tensor([t for _, input_ids in blocks for t in input_ids], dtype=torch.long)
        x = w.embed.rows(ids)                                                        # [rows, hidden]
        if s.embed_scale != 1.0:
            x = x * torch.tensor(s.embed_scale, dtype=torch.float32)
        x = x.contiguous()
        h = torch.empty_like(x)
        if self.native_layers is not None and row <= WIDE_ROWS and all(self._row_by_row(n) for *_, n, _ in segments):
            self.native_layers.run([seg[:4] for seg in segments], x, h, self.rope)   # the loop below, in C
        else:
            self._layers(segments, x, h)
        for cache, start, _, n, _ in segments:
            cache.length = start + n
        return segments, h

    def _head(self, h: torch.Tensor, argmax_only: bool = False) -> torch.Tensor:
        """logits [rows, vocab] = the head on h. A GGUF head writes into rows padded by 16 floats where a row of
        logits is a whole number of 4 KiB pages (vocabularies of 32 768, 49 152, 262 144): the C GEMM writes
        every row's element o before the next column, and with page-aligned rows those stores alias in the
        cache and slow a wide head (BENCHMARKS.md, twenty-third session). The values are the same; the tensor
        returned is a view with that row stride."""
        head, vocab = self.weights.head, self.spec.vocab
        greedy = argmax_only and h.shape[0] in self.greedy_widths
        if not isinstance(head, BlockWeight) or ((vocab * 4) % 4096 and not greedy):
            return head.matmul(h)
        logits = torch.empty(h.shape[0], vocab + 16)[:, :vocab]
        if not (greedy and self.greedy_head.logits_into(h, logits)):
            head.matmul_into(h, logits)
        return logits

    def use_greedy_head(self, on: bool) -> frozenset[int]:
        """The greedy head at every width up to its limit (``on``) or at none (``--greedy-head on|off``)."""
        if self.greedy_head is not None:
            self.greedy_widths = frozenset(range(1, greedy_head.MAX_ROWS + 1)) if on else frozenset()
            self.greedy_note = (f"argmax-only rows at widths 1-{greedy_head.MAX_ROWS} (--greedy-head on)" if on
                                else "off (--greedy-head off)")
        return self.greedy_widths

    def measure_greedy_head(self, widths: Sequence[int] = (1, 2, 4, 8), repeats: int = 7,
                            margin: float = 0.95) -> frozenset[int]:
        """Times the greedy head (``verifier_service.greedy_head``) against the full head at each width (rows of
        h: the model's own hidden states after a fixed probe text of ``probe`` token ids), interleaved, and
        keeps the widths where it takes at most ``margin`` of the full head's time (a width between two measured
        ones follows the next wider). On the torch thread."""
        if self.greedy_head is None:
            return self.greedy_widths
        vocab = self.spec.vocab
        faster, cells = {}, []
        with torch.inference_mode():
            top = min(greedy_head.MAX_ROWS, max(widths))
            probe = [(7 * i + 3) % vocab for i in range(32 + top)]
            hidden = self._hidden([(self.new_cache(), probe)])[1][-top:].clone()
            for w in sorted({int(x) for x in widths if 0 < int(x) <= greedy_head.MAX_ROWS}):
                h = hidden[:w].contiguous()
                out = torch.empty(w, vocab + 16)[:, :vocab]
                self.greedy_head.logits_into(h, out)             # first touches (its scratch, the l1 table)
                full, fast = [], []
                for _ in range(max(1, repeats)):
                    t0 = time.perf_counter()
                    self.weights.head.matmul_into(h, out)
                    t1 = time.perf_counter()
                    ok = self.greedy_head.logits_into(h, out)
                    t2 = time.perf_counter()
                    full.append(t1 - t0)
                    fast.append(t2 - t1 if ok else float("inf"))
                f, g = min(full) * 1e3, min(fast) * 1e3
                cells.append(f"w{w} {g:.2f}/{f:.2f} ms")
                faster[w] = g <= margin * f
        use = {x for x in range(1, max(faster, default=0) + 1) if faster[min(m for m in faster if m >= x)]}
        self.greedy_widths = frozenset(use)
        self.greedy_note = ((f"argmax-only rows at widths {', '.join(map(str, sorted(use)))}" if use
                             else "measured slower") + f" (greedy / full head: {', '.join(cells)})")
        return self.greedy_widths

    def _layers(self, segments, x: torch.Tensor, h: torch.Tensor) -> None:
        """Every layer over the rows of ``segments``: x (the residual stream) in place, h = its final norm."""
        s, w, ops = self.spec, self.weights, self.ops
        ops.add_rms_norm(x, None, w.layers[0].attn_norm, s.norm_eps, h)
        for i, layer in enumerate(w.layers):
            qkv = layer.qkv.matmul(h)                                               # [rows, (H + 2 KV) D]
            if layer.qkv_bias is not None:
                qkv += layer.qkv_bias
            attended = []
            for cache, start, first, n, attend in segments:        # each block over its own cache
                cos, sin = self.rope(i, start, n)
                q = ops.rope_store(qkv[first:first + n], s.heads, s.kv_heads, s.head_dim, cos, sin, s.rope_layout,
                                   cache.kv[i], start, layer.q_norm, layer.k_norm, s.norm_eps)      # [n, H, D]
                attended.append(attend(q, cache.kv[i], start, s.scale, s.windows[i]))            # [n, H D]
            o = layer.o.matmul(attended[0] if len(attended) == 1 else torch.cat(attended))
            if layer.post_attn_norm is not None:
                o = ops.rms_norm(o, layer.post_attn_norm, s.norm_eps)
            ops.add_rms_norm(x, o, layer.ffn_norm, s.norm_eps, h)                   # x += o; h = norm(x)
            down = layer.down.matmul(ops.gated(layer.gate_up.matmul(h), s.activation))
            if layer.post_ffn_norm is not None:
                down = ops.rms_norm(down, layer.post_ffn_norm, s.norm_eps)
            following = w.layers[i + 1].attn_norm if i + 1 < len(w.layers) else w.final_norm
            ops.add_rms_norm(x, down, following, s.norm_eps, h)                     # x += down; h = norm(x)

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

