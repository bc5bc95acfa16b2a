"""What tells one decoder-only transformer from another, as data: ``DecoderSpec``.

The decoder (``verifier_service.decoder``) runs the layer math once for every architecture here; this
module says which parts a model has and with what numbers: per-layer attention window and rope base,
q/k norms, norms after attention and MLP ("sandwich" norms, Gemma), the MLP activation, biases on
q/k/v, the embedding scale, the attention scale, and how the q/k weights are laid out for rope.

``from_gguf(file)`` reads it from a GGUF file's metadata with llama.cpp's conventions as stored:
  * rope layout: llama.cpp's converter permutes a Llama model's q/k rows so that rope rotates adjacent
    pairs (x[2i], x[2i+1]) ("interleaved"); Qwen2/Qwen3/Gemma 3 keep the Hugging Face layout, where rope
    rotates x[i] with x[i + d/2] ("halves", llama.cpp's NEOX mode);
  * Gemma norms: the file stores RMSNorm weight + 1 (Gemma multiplies by 1 + w), so every norm here is a
    plain multiplication by the stored vector;
  * Gemma 3: every 6th layer global, the others a sliding window of ``attention.sliding_window``
    (unless the file lists the pattern), local layers with rope base 10 000 (``rope.freq_base_swa``
    where given), embeddings scaled by sqrt(hidden), scores by head_dim^-0.5 (hidden / heads for the 27 B);
  * Llama 3 rope scaling: the file's ``rope_freqs.weight`` divides the frequencies.
Anything else (another architecture, soft-capping, YaRN, MoE) is ``UnsupportedModel`` with the reason,
which the start-up line shows when the target falls back to transformers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

INTERLEAVED, HALVES = "interleaved", "halves"
SILU, GELU_TANH = "silu", "gelu_tanh"
ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3")


class UnsupportedModel(ValueError):
    """The model is not one the decoder runs; the message says why (shown on the start-up line)."""


@dataclass(frozen=True)
class DecoderSpec:
    architecture: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    context: int
    norm_eps: float
    rope_layout: str                        # INTERLEAVED or HALVES (see the module docstring)
    rope_bases: tuple[float, ...]           # per layer
    windows: tuple[int, ...]                # per layer: keys a query sees (0: all before it)
    activation: str = SILU                  # gate activation of the gated MLP: SILU or GELU_TANH
    qk_norm: bool = False                   # RMSNorm over each head of q and k before rope
    sandwich_norms: bool = False            # RMSNorm on the attention and MLP outputs before the residual
    qkv_bias: bool = False
    embed_scale: float = 1.0                # embeddings multiplied by this (Gemma: sqrt(hidden))
    attn_scale: float = 0.0                 # score scale (0: head_dim ** -0.5)
    rope_factors: tuple[float, ...] | None = None   # per frequency divisor (Llama 3 rope scaling)
    rope_linear: tuple[float, ...] | None = None    # per layer position divisor (linear rope scaling)

    @property
    def scale(self) -> float:
        return self.attn_scale or self.head_dim ** -0.5

    @property
    def q_rows(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_rows(self) -> int:
        return self.kv_heads * self.head_dim

    def describe(self) -> str:
        windows = sorted({w for w in self.windows if w})
        parts = [self.architecture, f"{self.layers} layers", f"hidden {self.hidden}",
                 f"{self.heads}/{self.kv_heads} heads of {self.head_dim}"]
        if windows:
            parts.append(f"window {'/'.join(map(str, windows))} on {sum(1 for w in self.windows if w)} layers")
        if self.qk_norm:
            parts.append("q/k norm")
        if self.activation != SILU:
            parts.append(self.activation)
        return ", ".join(parts)


def _int(meta, key, default=None) -> int:
    value = meta.get(key, default)
    if value is None:
        raise UnsupportedModel(f"the file has no {key}")
    return int(value)


def _per_layer(value, layers: int, what: str) -> tuple:
    """A per-layer metadata value: a scalar for every layer or an array of one per layer."""
    if hasattr(value, "__len__") and not isinstance(value, str):
        values = [v for v in value]
        if len(values) != layers:
            raise UnsupportedModel(f"{what} lists {len(values)} values for {layers} layers")
        return tuple(values)
    return (value,) * layers


def from_gguf(gguf) -> DecoderSpec:
    """The ``DecoderSpec`` of a ``gguf_file.GgufFile``; ``UnsupportedModel`` (why) when the decoder cannot run it."""
    meta, tensors = gguf.metadata, gguf.tensors
    arch = str(meta.get("general.architecture", ""))
    if arch not in ARCHITECTURES:
        raise UnsupportedModel(f"architecture {arch!r} is not one of {', '.join(ARCHITECTURES)}")

    def key(name):
        return f"{arch}.{name}"

    for unsupported in ("expert_count", "attn_logit_softcapping", "final_logit_softcapping"):
        if meta.get(key(unsupported)):
            raise UnsupportedModel(f"{unsupported.replace('_', ' ')} ({key(unsupported)})")
    scaling = str(meta.get(key("rope.scaling.type"), "none") or "none")
    if scaling not in ("none", "linear"):
        raise UnsupportedModel(f"rope scaling {scaling!r}")
    layers = _int(meta, key("block_count"))
    hidden = _int(meta, key("embedding_length"))
    heads = _per_layer(meta.get(key("attention.head_count")), layers, "head_count")
    kv_heads = _per_layer(meta.get(key("attention.head_count_kv"), heads[0]), layers, "head_count_kv")
    if len(set(heads)) != 1 or len(set(kv_heads)) != 1:
        raise UnsupportedModel("head counts that differ between layers")
    heads, kv_heads = int(heads[0]), int(kv_heads[0])
    head_dim = int(meta.get(key("attention.key_length"), hidden // heads))
    if int(meta.get(key("attention.value_length"), head_dim)) != head_dim:
        raise UnsupportedModel("value heads of another size than key heads")
    rope_dims = int(meta.get(key("rope.dimension_count"), head_dim))
    if rope_dims != head_dim:
        raise UnsupportedModel(f"partial rope ({rope_dims} of {head_dim} dimensions)")
    embed = tensors.get("token_embd.weight")
    if embed is None:
        raise UnsupportedModel("the file has no token_embd.weight")
    vocab = int(meta.get(key("vocab_size"), embed.shape[0]))
    base = float(meta.get(key("rope.freq_base"), 10000.0))
    window = int(meta.get(key("attention.sliding_window"), 0) or 0)
    linear = float(meta.get(key("rope.scaling.factor"), 1.0) or 1.0) if scaling == "linear" else 1.0
    spec = dict(architecture=arch, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                ffn=_int(meta, key("feed_forward_length")), vocab=vocab,
                context=_int(meta, key("context_length"), 2048), norm_eps=float(meta.get(
                    key("attention.layer_norm_rms_epsilon"), 1e-6)),
                rope_layout=INTERLEAVED if arch in ("llama", "mistral") else HALVES,
                rope_bases=(base,) * layers, windows=(window,) * layers,
                qk_norm="blk.0.attn_q_norm.weight" in tensors,
                qkv_bias="blk.0.attn_q.bias" in tensors,
                rope_linear=(linear,) * layers if linear != 1.0 else None)
    if "rope_freqs.weight" in tensors:
        spec["rope_factors"] = tuple(float(f) for f in gguf.vector("rope_freqs.weight"))
    if arch == "gemma3":
        pattern = meta.get(key("attention.sliding_window_pattern"))
        if pattern is None or not hasattr(pattern, "__len__"):
            every = int(pattern or 6)
            local = tuple((i + 1) % every != 0 for i in range(layers))
        else:
            local = tuple(bool(p) for p in _per_layer(pattern, layers, "sliding_window_pattern"))
        local_base = float(meta.get(key("rope.freq_base_swa"), 10000.0))
        spec.update(windows=tuple(window if s else 0 for s in local),
                    rope_bases=tuple(local_base if s else base for s in local),
                    rope_linear=tuple(1.0 if s else linear for s in local) if linear != 1.0 else None,
                    activation=GELU_TANH, sandwich_norms=True, embed_scale=math.sqrt(hidden),
                    attn_scale=float(meta.get(key("attention.scale"), 0.0)) or (
                        (hidden / heads) ** -0.5 if layers == 62 else head_dim ** -0.5))
    elif meta.get(key("attention.scale")):
        spec["attn_scale"] = float(meta[key("attention.scale")])
    return DecoderSpec(**spec)
