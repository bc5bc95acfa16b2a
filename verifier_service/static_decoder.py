"""The target's forward without transformers' per-call machinery: a Llama-family decoder over the model's
own weights, a static KV cache indexed by position, and rows of a verify block computed as plain steps.

Why (issue 14): on the 2-core AMD EPYC, 1 thread, a width-1 step of SmolLM2-135M through transformers'
modules (with the oneDNN GEMMs) took 25.7 ms, its GEMMs alone 17.7 (module calls, mask and cache
bookkeeping, 7 linears per layer); this forward runs the same math in fewer ops:

  x = embed(ids)                                     [n, hidden]
  per layer:
    qkv = W_qkv . rms_norm(x)                        one GEMM for q, k and v (weights concatenated)
    q, k = rope(q, k at positions start..start+n-1)  cos/sin from the model's own rotary table
    cache[layer, start:start+n] = k, v               the cache is a preallocated tensor; no concat
    o = attention(q, cache[:start+n])                per row for verify blocks (below)
    x = x + W_o . o
    x = x + W_down . (silu(g) * u),  [g, u] = W_gate_up . rms_norm(x)   one GEMM for gate and up
  logits = W_head . rms_norm(x) for the rows asked for (the last one in prefill)

GEMMs: with a Q4_1/Q8_0 GGUF target, on the file's blocks as stored (``gguf_linear``: the same weights
in 111 MB instead of 538, measured at start against the fp32 kernels, ``--gemm auto``); otherwise on
oneDNN's packed fp32 weights or MKL (``fast_linear``). Where the C kernels build (``native``: Linux
x86-64, AVX-512, a C compiler) the per-row attention (``row_attention.c``) and the row-wise glue
(``layer_ops.c``: residual add + RMSNorm, RoPE + cache store, SiLU product) are one C call each per layer;
width-1 step, 2 threads: 14.3 ms with torch ops and oneDNN, 7.2 ms with the GGUF blocks and the C glue.

Exact rows (``exact_rows=True``): for blocks of up to ``ROW_BY_ROW_MAX`` rows, each query row attends
to its own causal prefix through the same single-row code a plain step runs, and every other op is
row-independent (GEMMs on oneDNN packed weights, see ``fast_linear``; row-wise norms; elementwise ops),
so row i of a verify block is bit-identical to the plain step that would have computed it: greedy
speculative output equals plain decoding exactly. Prefill chunks (more rows) use one masked SDPA call.

The KV rollback is ``StaticKVCache.crop``: the length moves back, nothing is copied.

``supports(model)`` says whether a model has this structure (LlamaForCausalLM and the models that copy
it: q/k/v (and gate/up) with biases on all or none, no sliding window, no q/k norms, pre-norm RMSNorm, SiLU MLP).
Anything else keeps transformers' forward (``Target`` falls back).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from verifier_service import fast_linear, gguf_linear, native

GGUF = "gguf"                 # --gemm: GEMMs on the GGUF file's blocks as stored (verifier_service.gguf_linear)
CHOICE_WIDTHS = (1, 2, 3, 4, 5)   # 'auto' compares the GGUF kernel over these widths: a plain step and k <= 4,
                                  # ~90 % of auto's rounds in the Spec-Bench runs of BENCHMARKS.md
ROW_BY_ROW_MAX = 32           # blocks up to this many rows attend row by row (exact rows)
SUPPORTED_TYPES = ("llama", "mistral", "qwen2")
CACHE_STEP = 256              # the cache grows in steps of this many positions (at least doubling)


def unsupported_reason(model) -> str | None:
    """None when ``StaticDecoder`` can run ``model``; otherwise why not (kept for the start-up line)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED_TYPES:
        return f"model type {getattr(config, 'model_type', None)!r} is not one of {SUPPORTED_TYPES}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type in ("dynamic", "longrope"):
        return f"rope type {rope_type!r} (its frequencies depend on the sequence length; the table here is static)"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not hasattr(inner, "rotary_emb") or not hasattr(inner, "norm"):
        return "not a decoder with model.layers / rotary_emb / norm"
    weight = model.get_output_embeddings().weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return f"the static decoder is for CPU fp32 ({weight.device.type}, {weight.dtype})"
    for layer in layers:
        a, m = layer.self_attn, layer.mlp
        if not all(hasattr(a, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
            return "attention without q/k/v/o projections"
        if not all(hasattr(m, n) for n in ("gate_proj", "up_proj", "down_proj")):
            return "MLP without gate/up/down projections"
        if getattr(a, "q_norm", None) is not None or getattr(a, "k_norm", None) is not None:
            return "q/k norms"
        if (m.gate_proj.bias is None) != (m.up_proj.bias is None):
            return "mixed gate/up biases"
        if len({a.q_proj.bias is None, a.k_proj.bias is None, a.v_proj.bias is None}) != 1:
            return "mixed q/k/v biases"
    return None


def supports(model) -> bool:
    return unsupported_reason(model) is None


class StaticKVCache:
    """K and V of every layer for one session: one tensor [layers, 2, kv_heads, capacity, head_dim],
    indexed by position. ``length`` positions are valid; ``crop`` moves the length back (the rollback);
    ``reserve`` grows the capacity (a copy, at least doubling) before a forward writes past it."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, max_length: int, capacity: int | None = None):
        self.max_length = int(max_length)
        capacity = CACHE_STEP if capacity is None else int(capacity)
        # empty, not zeros: positions >= length are written before they are read, and a fill is a parallel
        # region, which must not run off the torch thread (verifier_service.torch_thread)
        self.kv = torch.empty(layers, 2, kv_heads, max(1, min(capacity, self.max_length)), head_dim)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.kv.shape[3]

    def reserve(self, length: int) -> None:
        if length > self.max_length:
            raise ValueError(f"{length} positions exceed the target's context of {self.max_length}")
        if length <= self.capacity:
            return
        capacity = min(self.max_length, max(2 * self.capacity, math.ceil(length / CACHE_STEP) * CACHE_STEP))
        grown = self.kv.new_empty(*self.kv.shape[:3], capacity, self.kv.shape[4])
        grown[:, :, :, :self.length] = self.kv[:, :, :, :self.length]
        self.kv = grown

    # the DynamicCache calls TargetSession uses
    def get_seq_length(self) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        """Keeps the first ``max_length`` positions (negative: drops the last -max_length), as DynamicCache.crop."""
        keep = self.length + max_length if max_length < 0 else max_length
        if not 0 <= keep <= self.length:
            raise ValueError(f"cannot keep {keep} of {self.length} cached positions")
        self.length = keep

    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


def _merged_linear(linears: Sequence[nn.Linear]) -> nn.Linear:
    """One nn.Linear whose output is the concatenation of ``linears``' outputs. The originals' weights become
    views into the merged one (no second dense copy; the transformers model keeps working)."""
    weight = torch.cat([lin.weight.detach() for lin in linears]).contiguous()
    bias = None if linears[0].bias is None else torch.cat([lin.bias.detach() for lin in linears]).contiguous()
    merged = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    merged.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        merged.bias = nn.Parameter(bias, requires_grad=False)
    row = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = nn.Parameter(weight[row:row + rows], requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias[row:row + rows], requires_grad=False)
        row += rows
    return merged


def _splits(rows: Sequence[int]) -> list[tuple[int, int]]:
    """Row ranges of the parts of a merged weight: (3, 2) -> [(0, 3), (3, 5)]."""
    out, start = [], 0
    for r in rows:
        out.append((start, start + r))
        start += r
    return out


class _Layer(nn.Module):
    def __init__(self, layer):
        super().__init__()
        a, m = layer.self_attn, layer.mlp
        self.qkv_rows = (a.q_proj.weight.shape[0], a.k_proj.weight.shape[0], a.v_proj.weight.shape[0])
        self.gate_up_rows = (m.gate_proj.weight.shape[0], m.up_proj.weight.shape[0])
        self.qkv = _merged_linear([a.q_proj, a.k_proj, a.v_proj])
        self.o = a.o_proj
        self.gate_up = _merged_linear([m.gate_proj, m.up_proj])
        self.down = m.down_proj
        self.norm1 = layer.input_layernorm.weight.detach()
        self.norm2 = layer.post_attention_layernorm.weight.detach()
        self.eps1 = float(layer.input_layernorm.variance_epsilon)
        self.eps2 = float(layer.post_attention_layernorm.variance_epsilon)


class _Linears(nn.Module):
    """The decoder's linear layers as modules, so ``fast_linear.install/choose_gemm`` can pack and time them."""

    def __init__(self, layers: Iterable[_Layer], head: nn.Linear):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.head = head


class StaticDecoder:
    """The forward of a Llama-family ``model`` (see the module docstring); build with ``StaticDecoder(model)``."""

    def __init__(self, model, *, gemm: str = "auto", widths: Iterable[int] = range(1, 10), exact_rows: bool = True,
                 gguf_path: str | None = None, native_ops: bool = True):
        """``gemm``: "auto" (measure; with ``gguf_path``, the GGUF kernel competes too), "gguf", "onednn" or
        "mkl". ``gguf_path``: the file the model was loaded from, whose blocks the "gguf" kernel reads.
        ``native_ops``: attention and row-wise glue in C where the kernels build (False: torch ops, to compare)."""
        reason = unsupported_reason(model)
        if reason:
            raise ValueError(f"the static decoder cannot run this model: {reason}")
        config = model.config
        inner = model.model
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.group = self.heads // self.kv_heads
        self.scale = float(getattr(inner.layers[0].self_attn, "scaling", self.head_dim ** -0.5))
        self.max_length = int(getattr(config, "max_position_embeddings", 2048))
        self.exact_rows = bool(exact_rows)
        self.embed = inner.embed_tokens.weight.detach()
        self.norm = inner.norm.weight.detach()
        self.norm_eps = float(inner.norm.variance_epsilon)
        self._rotary = inner.rotary_emb
        self._cos = self._sin = torch.empty(0, self.head_dim)
        with torch.no_grad():
            self.linears = _Linears([_Layer(layer) for layer in inner.layers], model.get_output_embeddings())
        self.layers = list(self.linears.layers)
        # exact-rows attention in one C call per layer (native.row_attention) and the row-wise glue (norms,
        # rope + cache store, SiLU product) in C, where the kernels build here; torch ops otherwise
        lib = native.library() if native_ops else None
        self._row_attention = lib if self.head_dim % 16 == 0 else None
        self._glue = lib if self.head_dim % 2 == 0 else None
        self.gguf_bytes = 0
        packs, why_not = self._gguf_packs(gguf_path) if gemm in ("auto", GGUF) else (None, "")
        if gemm == GGUF:
            if packs is None:
                raise ValueError(f"--gemm gguf cannot run here: {why_not}")
            if fast_linear.onednn_available():      # prefill chunks (wide inputs) on oneDNN, 2x MKL's speed here
                fast_linear.configure(self.linears, fast_linear.ONEDNN, widths)
            self._install_gguf(packs)
            self.gemm, self.gemm_note, self.gemm_choice = GGUF, "asked for", None
        else:
            self.gemm, self.gemm_note, self.gemm_choice = fast_linear.configure(self.linears, gemm, widths)
            if packs is not None:
                self._choose_gguf(packs)
            elif gemm == "auto" and gguf_path:
                self.gemm_note += f"; GGUF kernel not used: {why_not}"
        self._positions(min(self.max_length, 4096))

    # ---- the GGUF kernel ---------------------------------------------------------------------------
    def _modules(self) -> list[tuple[object, str]]:
        """(owner, attribute) of every linear: per layer qkv, o, gate_up, down, then the head."""
        return [(layer, a) for layer in self.layers for a in ("qkv", "o", "gate_up", "down")] + [(self.linears, "head")]

    def _gguf_packs(self, path) -> tuple[list | None, str]:
        """Every linear's weight as the file's blocks (same order as ``_modules``), or (None, why)."""
        if not path:
            return None, "the target was not loaded from a GGUF file"
        if native.library() is None:
            return None, native.unavailable_reason()
        try:
            weights = gguf_linear.GgufWeights(path)
        except Exception as e:  # noqa: BLE001 - an unreadable file only means: not this kernel
            return None, f"cannot read {path}: {e}"
        packs = []
        names = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate", "up": "ffn_up",
                 "down": "ffn_down"}
        for i, layer in enumerate(self.layers):
            def one(part: str, weight: torch.Tensor):
                packed, why = weights.rows_for(weight, f"blk.{i}.{names[part]}.weight")
                if packed is None:
                    raise LookupError(why)
                return packed
            q, k, v = (layer.qkv.weight[a:b] for a, b in _splits(layer.qkv_rows))
            gate, up = (layer.gate_up.weight[a:b] for a, b in _splits(layer.gate_up_rows))
            try:
                packs += [gguf_linear.Packed.cat([one("q", q), one("k", k), one("v", v)]), one("o", layer.o.weight),
                          gguf_linear.Packed.cat([one("gate", gate), one("up", up)]), one("down", layer.down.weight)]
            except LookupError as e:
                return None, str(e)
        head = self.linears.head.weight
        packed, why = weights.rows_for(head, "output.weight")
        if packed is None:
            packed, why2 = weights.rows_for(head, "token_embd.weight")      # tied embeddings
            if packed is None:
                return None, f"{why}; {why2}"
        packs.append(packed)
        return packs, ""        # biases (qwen2's q/k/v) stay fp32: GgufLinear adds them

    def _install_gguf(self, packs) -> None:
        for (owner, attr), packed in zip(self._modules(), packs):
            old = getattr(owner, attr)
            if isinstance(old, gguf_linear.GgufLinear):
                old = old.wide
            # prefill chunks (many rows) keep the fp32 GEMM the layer had: compute-bound, faster there
            setattr(owner, attr, gguf_linear.GgufLinear(packed, getattr(old, "bias", None), wide=old))
        self.gguf_bytes = sum(p.nbytes for p in packs)

    def time_linears(self, widths: Sequence[int], repeats: int = 3) -> dict[int, float]:
        """Median ms of all linears at each width (random inputs)."""
        gen = torch.Generator().manual_seed(0)
        inputs = {w: {m.in_features: torch.randn(w, m.in_features, generator=gen)
                      for m in (getattr(o, a) for o, a in self._modules())} for w in widths}
        samples: dict[int, list[float]] = {w: [] for w in widths}
        with torch.inference_mode():
            for _ in range(repeats):
                for w in widths:
                    t0 = time.perf_counter()
                    for owner, attr in self._modules():
                        module = getattr(owner, attr)
                        module(inputs[w][module.in_features])
                    samples[w].append((time.perf_counter() - t0) * 1e3)
        return {w: sorted(v)[len(v) // 2] for w, v in samples.items()}

    def _choose_gguf(self, packs) -> None:
        """'auto': keeps the GGUF kernel when its total over ``CHOICE_WIDTHS`` beats the measured fp32 choice."""
        fp32 = self.time_linears(CHOICE_WIDTHS)
        previous = [getattr(o, a) for o, a in self._modules()]
        self._install_gguf(packs)
        quant = self.time_linears(CHOICE_WIDTHS)
        table = ", ".join(f"w{w} {quant[w]:.1f}/{fp32[w]:.1f}" for w in CHOICE_WIDTHS)
        if sum(quant.values()) < sum(fp32.values()):
            self.gemm, self.gemm_choice = GGUF, None
            self.gemm_note = f"measured: GGUF blocks {self.gguf_bytes / 1e6:.0f} MB, ms gguf/fp32 {table}"
            return
        for (owner, attr), module in zip(self._modules(), previous):
            setattr(owner, attr, module)
        self.gguf_bytes = 0
        self.gemm_note += f"; GGUF kernel slower (ms gguf/fp32 {table})"

    # ---- set-up ------------------------------------------------------------------------------
    @property
    def rows_independent(self) -> bool:
        """True when a row's logits cannot depend on the block width (one GEMM kernel at every width, exact rows)."""
        return self.exact_rows and (self.gemm_choice is None or self.gemm_choice.uniform)

    def describe(self) -> str:
        kernels = self.gemm if self.gemm_choice is None else self.gemm_choice.describe()
        if self.gemm == GGUF:
            kernels = f"on the GGUF blocks ({self.gguf_bytes / 1e6:.0f} MB)"
        how = "C kernel" if self._row_attention is not None else "torch"
        if self._glue is not None:
            how += "; norms, rope, SiLU in C"
        return (f"static decoder: {len(self.layers)} layers, GEMMs {kernels}; "
                f"rows {f'exact (row-wise attention, {how})' if self.exact_rows else 'batched'}")

    def _positions(self, upto: int) -> None:
        """Extends the cos/sin tables [positions, head_dim] to ``upto`` positions (the model's rotary embedding)."""
        have = self._cos.shape[0]
        if upto <= have:
            return
        upto = min(self.max_length, max(upto, 2 * have))
        with torch.inference_mode():
            pos = torch.arange(upto)[None]
            cos, sin = self._rotary(self.embed[:1], pos)
        self._cos, self._sin = cos[0].float().contiguous(), sin[0].float().contiguous()

    def new_cache(self) -> StaticKVCache:
        return StaticKVCache(len(self.layers), self.kv_heads, self.head_dim, self.max_length)

    # ---- the forward -------------------------------------------------------------------------
    def _row_by_row(self, n: int) -> bool:
        """Whether a forward of n rows attends row by row (exact rows) rather than in one masked SDPA call."""
        return n <= ROW_BY_ROW_MAX and (self.exact_rows or n == 1)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = self.head_dim // 2                                       # x [n, heads, head_dim]
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def _attend_row_by_row(self, q: torch.Tensor, kv: torch.Tensor, start: int) -> torch.Tensor:
        """q [n, heads, head_dim] at positions start..start+n-1; kv [2, kv_heads, capacity, head_dim].
        Row i attends to keys 0..start+i with the code a width-1 step runs; returns [n, heads * head_dim]."""
        n = q.shape[0]
        if self._row_attention is not None and q.stride(2) == 1 and q.stride(1) == self.head_dim:
            out = torch.empty(n, self.heads * self.head_dim)
            plane = kv.shape[1] * kv.shape[2] * kv.shape[3]                          # KV * capacity * D
            base = kv.data_ptr()
            self._row_attention.row_attention(q.data_ptr(), q.stride(0), n, self.heads, self.kv_heads, self.head_dim,
                                              base, base + plane * kv.element_size(), kv.shape[2], start,
                                              self.scale, out.data_ptr(), torch.get_num_threads())
            return out
        qg = (q * self.scale).view(n, self.kv_heads, self.group, self.head_dim)      # [n, KV, G, D]
        rows = []
        for i in range(n):
            keys = kv[0, :, :start + i + 1]                                         # [KV, m, D]
            values = kv[1, :, :start + i + 1]
            scores = torch.bmm(qg[i], keys.transpose(1, 2))                         # [KV, G, m]
            rows.append(torch.bmm(torch.softmax(scores, dim=-1), values))          # [KV, G, D]
        return torch.stack(rows).reshape(n, self.heads * self.head_dim)

    def _attend_block(self, q: torch.Tensor, kv: torch.Tensor, start: int) -> torch.Tensor:
        """All n rows in one SDPA call with a causal mask offset by ``start`` cached positions."""
        n = q.shape[0]
        total = start + n
        keys = kv[0, :, :total][None]                                                # [1, KV, total, D]
        values = kv[1, :, :total][None]
        mask = torch.ones(n, total, dtype=torch.bool).tril(diagonal=start)          # row i sees 0..start+i
        out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys, values, attn_mask=mask,
                                             scale=self.scale, enable_gqa=self.group > 1)   # [1, H, n, D]
        return out[0].transpose(0, 1).reshape(n, self.heads * self.head_dim)

    @torch.inference_mode()
    def forward(self, cache: StaticKVCache, input_ids: Sequence[int], last_only: bool = False) -> torch.Tensor:
        """Feeds ``input_ids`` after the cache's ``length`` positions, appends their K/V, and returns logits
        [len(input_ids), vocab] (``last_only``: [1, vocab], the last row)."""
        n = len(input_ids)
        start = cache.length
        cache.reserve(start + n)
        self._positions(start + n)
        ids = torch.as_tensor(list(input_ids), dtype=torch.long)
        x = F.embedding(ids, self.embed)                                                # [n, hidden]
        if self._glue is not None:
            return self._forward_glue(cache, x, start, last_only)
        cos = self._cos[start:start + n, None]                                          # [n, 1, D]
        sin = self._sin[start:start + n, None]
        qk_width = (self.heads + self.kv_heads) * self.head_dim
        row_by_row = self._row_by_row(n)
        for index, layer in enumerate(self.layers):
            kv = cache.kv[index]                                                        # [2, KV, capacity, D]
            h = F.rms_norm(x, (x.shape[-1],), layer.norm1, layer.eps1)
            qkv = layer.qkv(h)                                                          # [n, (H + 2 KV) D]
            qk = self._rope(qkv[:, :qk_width].view(n, self.heads + self.kv_heads, self.head_dim), cos, sin)
            kv[0, :, start:start + n] = qk[:, self.heads:].transpose(0, 1)
            kv[1, :, start:start + n] = qkv[:, qk_width:].view(n, self.kv_heads, self.head_dim).transpose(0, 1)
            q = qk[:, :self.heads]
            attended = self._attend_row_by_row(q, kv, start) if row_by_row else self._attend_block(q, kv, start)
            x = x + layer.o(attended)
            h = F.rms_norm(x, (x.shape[-1],), layer.norm2, layer.eps2)
            gate_up = layer.gate_up(h)                                                  # [n, 2 I]
            inner = gate_up.shape[1] // 2
            x = x + layer.down(F.silu(gate_up[:, :inner]) * gate_up[:, inner:])
        cache.length = start + n
        if last_only:
            x = x[-1:]
        return self.linears.head(F.rms_norm(x, (x.shape[-1],), self.norm, self.norm_eps))

    def _forward_glue(self, cache: StaticKVCache, x: torch.Tensor, start: int, last_only: bool) -> torch.Tensor:
        """``forward`` with the row-wise ops in C (layer_ops.c); the same math, x [n, hidden] updated in place."""
        lib = self._glue
        n, hidden = x.shape
        H, KV, D = self.heads, self.kv_heads, self.head_dim
        row_by_row = self._row_by_row(n)
        cos, sin = self._cos[start:start + n], self._sin[start:start + n]                # [n, D], contiguous
        h = torch.empty_like(x)
        xp, hp = x.data_ptr(), h.data_ptr()
        lib.add_rms_norm(xp, None, n, hidden, self.layers[0].norm1.data_ptr(), self.layers[0].eps1, hp)
        plane = cache.kv.shape[2] * cache.kv.shape[3] * cache.kv.shape[4]                # KV * capacity * D
        capacity = cache.kv.shape[3]
        for index, layer in enumerate(self.layers):
            kv = cache.kv[index]                                                        # [2, KV, capacity, D]
            qkv = layer.qkv(h)                                                          # [n, (H + 2 KV) D]
            q = torch.empty(n, H * D)
            k_base = kv.data_ptr()
            lib.rope_store(qkv.data_ptr(), n, H, KV, D, cos.data_ptr(), sin.data_ptr(), k_base,
                           k_base + plane * kv.element_size(), capacity, start, q.data_ptr())
            q3 = q.view(n, H, D)
            attended = self._attend_row_by_row(q3, kv, start) if row_by_row else self._attend_block(q3, kv, start)
            o = layer.o(attended)
            lib.add_rms_norm(xp, o.data_ptr(), n, hidden, layer.norm2.data_ptr(), layer.eps2, hp)   # x += o
            gate_up = layer.gate_up(h)                                                  # [n, 2 I]
            inner = gate_up.shape[1] // 2
            act = torch.empty(n, inner)
            lib.silu_mul(gate_up.data_ptr(), n, inner, act.data_ptr())
            down = layer.down(act)
            following = self.layers[index + 1] if index + 1 < len(self.layers) else None
            norm, eps = (following.norm1, following.eps1) if following is not None else (self.norm, self.norm_eps)
            lib.add_rms_norm(xp, down.data_ptr(), n, hidden, norm.data_ptr(), eps, hp)  # x += down; h = norm(x)
        cache.length = start + n
        return self.linears.head(h[-1:] if last_only else h)
