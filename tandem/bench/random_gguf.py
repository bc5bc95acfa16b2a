"""GGUF files with random weights in real block layouts: Llama-shaped bench targets at realistic sizes, and
tiny files of every block type and architecture for tests.

    python -m tandem.bench.random_gguf --params 1.5b --out /tmp/llama-1.5b-q4_k_m.gguf
    python -m tandem.bench.random_gguf --params 3b --out /tmp/llama-3b-q4_k_m.gguf

``--params`` files use the Q4_K_M mix (Q4_K for most weights; Q6_K for the output, attn_v and every other
ffn_down; F32 norms) and the default target's tokenizer (its metadata copied), so ``tandem up --target``,
``tandem bench --target`` and ``python -m tandem.bench.forward_costs --target`` load them like any GGUF.
Blocks are random bytes with their fp16 scales set so that weights have a chosen spread (gguf-py has no
K-quant quantizer; every block is valid: finite scales, any quant bits). Legacy and float kinds of tiny
files are quantized from random normal weights with gguf-py.

``write(path, arch=..., ...)`` is the library entry point (tests write tiny files into a temporary folder).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

# (hidden, layers, heads, kv_heads, ffn) of the bench shapes (Llama 3.2-like; vocabulary: the default target's)
SIZES = {"1.5b": (2048, 22, 32, 8, 8192), "3b": (3072, 28, 24, 8, 8192)}
Q4_K_M = {"default": "Q4_K", "output": "Q6_K", "attn_v": "Q6_K", "ffn_down_odd": "Q6_K"}
# fp16 scale fields per block kind: (byte offset, multiple of the base scale); quants are random bits
_SCALES = {"Q4_0": [(0, 1.0)], "Q4_1": [(0, 1.0), (2, -7.5)], "Q5_0": [(0, 1.0)], "Q5_1": [(0, 1.0), (2, -15.5)],
           "Q8_0": [(0, 1.0)], "Q4_K": [(0, 1.0), (2, 7.5)], "Q5_K": [(0, 1.0), (2, 15.5)], "Q6_K": [(208, 1.0)]}
# the spread of a weight is base scale x this (the quant levels' and sub-block scales' spread)
_SPREAD = {"Q4_0": 4.6, "Q4_1": 4.6, "Q5_0": 9.2, "Q5_1": 9.2, "Q8_0": 74.0, "Q4_K": 31.5 * 4.6,
           "Q5_K": 31.5 * 9.2, "Q6_K": 74.0 * 18.5}


def _geometry(kind: str) -> tuple[int, int]:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType[kind]]


def random_tensor(kind: str, out: int, inner: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """A [out, inner] weight of ``kind``: float kinds as values, block kinds as [out, bytes a row] uint8."""
    import gguf

    if kind in ("F32", "F16", "BF16") or (kind in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0") and out * inner <= 1 << 22):
        values = rng.normal(0.0, std, size=(out, inner)).astype(np.float32)
        if kind == "F32":
            return values
        if kind == "F16":
            return values.astype(np.float16)
        return gguf.quants.quantize(values, gguf.GGMLQuantizationType[kind])
    per_block, block_bytes = _geometry(kind)
    blocks = out * inner // per_block
    raw = rng.integers(0, 256, size=(blocks, block_bytes), dtype=np.uint8)
    base = std / _SPREAD[kind]
    for offset, multiple in _SCALES[kind]:
        jitter = rng.uniform(0.5, 1.5, size=blocks).astype(np.float32)
        raw[:, offset:offset + 2] = (base * multiple * jitter).astype(np.float16).view(np.uint8).reshape(blocks, 2)
    return raw.reshape(out, -1)


def _copy_tokenizer(writer, source) -> int:
    """Copies the tokenizer metadata of GGUF file ``source`` into ``writer``; returns the vocabulary size."""
    from verifier_service.gguf_file import GgufFile, StringArray

    src = GgufFile(source)
    for key, value in src.metadata.items():
        if not key.startswith("tokenizer."):
            continue
        if isinstance(value, StringArray):
            writer.add_array(key, list(value))
        elif isinstance(value, np.ndarray):
            writer.add_array(key, value.tolist())
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
    return len(src.metadata["tokenizer.ggml.tokens"])


def _tiny_tokenizer(writer, vocab: int) -> None:
    """A byte-level BPE vocabulary of ``vocab`` tokens (GPT-2 byte symbols, no merges): enough for transformers
    to build a tokenizer from the file."""
    symbols = _byte_symbols()
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + symbols
    tokens = (tokens + [f"<extra_{i}>" for i in range(max(0, vocab - len(tokens)))])[:vocab]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t.startswith("<") and t.endswith(">") else 1 for t in tokens])
    writer.add_token_merges([])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                             "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def write(path: str | Path, *, arch: str = "llama", hidden: int = 256, layers: int = 2, heads: int = 4,
          kv_heads: int = 2, ffn: int = 512, head_dim: int | None = None, vocab: int = 260, context: int = 512,
          kinds: dict[str, str] | None = None, std: float = 0.02, tokenizer_from: str | Path | None = None,
          window: int = 0, tied: bool = False, seed: int = 0, name: str | None = None) -> Path:
    """Writes a random GGUF decoder of ``arch`` (llama, qwen2 with q/k/v biases, qwen3 with q/k norms, gemma3
    with its norms and windows; ``window`` adds a sliding window to llama/qwen2/qwen3). ``kinds``: block kind
    by role ("default", "token_embd", "output", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
    "ffn_up", "ffn_down", "ffn_down_odd" for odd layers). ``tokenizer_from``: a GGUF whose tokenizer to copy
    (its vocabulary sets ``vocab``); otherwise a byte-level one of ``vocab`` tokens."""
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    kinds = {"default": "Q8_0", **(kinds or {})}
    head_dim = head_dim or hidden // heads
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name or f"random {arch}")
    if tokenizer_from is not None:
        vocab = _copy_tokenizer(writer, tokenizer_from)
    else:
        _tiny_tokenizer(writer, vocab)
    writer.add_context_length(context)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-6 if arch == "gemma3" else 1e-5)
    writer.add_rope_freq_base(1e6 if arch == "gemma3" else 1e4)
    writer.add_rope_dimension_count(head_dim)
    if head_dim != hidden // heads or arch in ("gemma3", "qwen3"):
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if window:
        writer.add_sliding_window(window)
    writer.add_vocab_size(vocab)
    writer.add_file_type(15)

    def kind_of(role: str, layer: int = 0) -> str:
        if role == "ffn_down" and layer % 2 and "ffn_down_odd" in kinds:
            return kinds["ffn_down_odd"]
        return kinds.get(role, kinds["default"])

    plan = []                                           # (name, kind, out, inner)
    plan.append(("token_embd.weight", kind_of("token_embd"), vocab, hidden))
    if not tied:
        plan.append(("output.weight", kind_of("output"), vocab, hidden))
    plan.append(("output_norm.weight", "F32", hidden, 0))
    for i in range(layers):
        p = f"blk.{i}."
        plan += [(p + "attn_norm.weight", "F32", hidden, 0), (p + "ffn_norm.weight", "F32", hidden, 0),
                 (p + "attn_q.weight", kind_of("attn_q", i), heads * head_dim, hidden),
                 (p + "attn_k.weight", kind_of("attn_k", i), kv_heads * head_dim, hidden),
                 (p + "attn_v.weight", kind_of("attn_v", i), kv_heads * head_dim, hidden),
                 (p + "attn_output.weight", kind_of("attn_output", i), hidden, heads * head_dim),
                 (p + "ffn_gate.weight", kind_of("ffn_gate", i), ffn, hidden),
                 (p + "ffn_up.weight", kind_of("ffn_up", i), ffn, hidden),
                 (p + "ffn_down.weight", kind_of("ffn_down", i), hidden, ffn)]
        if arch == "qwen2":
            plan += [(p + "attn_q.bias", "F32", heads * head_dim, 0), (p + "attn_k.bias", "F32", kv_heads * head_dim, 0),
                     (p + "attn_v.bias", "F32", kv_heads * head_dim, 0)]
        if arch in ("qwen3", "gemma3"):
            plan += [(p + "attn_q_norm.weight", "F32", head_dim, 0), (p + "attn_k_norm.weight", "F32", head_dim, 0)]
        if arch == "gemma3":
            plan += [(p + "post_attention_norm.weight", "F32", hidden, 0), (p + "post_ffw_norm.weight", "F32", hidden, 0)]

    def make(name: str, kind: str, out: int, inner: int) -> np.ndarray:
        if inner == 0:                                  # a vector: norms near 1 (Gemma's stored as 1 + w), biases
            if name.endswith(".bias"):
                return rng.normal(0.0, 0.1, size=out).astype(np.float32)
            return rng.uniform(0.8, 1.2, size=out).astype(np.float32)
        return random_tensor(kind, out, inner, std, rng)

    def raw_dtype(kind: str):
        return None if kind in ("F32", "F16") else gguf.GGMLQuantizationType[kind]

    for name_, kind, out, inner in plan:               # tensor infos first (sizes only)
        per_block, block_bytes = _geometry(kind)
        shape = (out,) if inner == 0 else (out, inner)
        nbytes = int(np.prod(shape)) // per_block * block_bytes
        dtype = {"F32": np.float32, "F16": np.float16}.get(kind, np.uint8)
        byte_shape = shape if kind in ("F32", "F16") else (out, inner // per_block * block_bytes)
        writer.add_tensor_info(name_, byte_shape, np.dtype(dtype), nbytes, raw_dtype=raw_dtype(kind))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name_, kind, out, inner in plan:               # then the data, one tensor in memory at a time
        writer.write_tensor_data(make(name_, kind, out, inner))
    writer.close()
    return path


def parameters(hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, vocab: int) -> int:
    head_dim = hidden // heads
    per_layer = hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * ffn
    return layers * per_layer + 2 * vocab * hidden


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--params", choices=sorted(SIZES), required=True, help="model size (Llama-shaped)")
    p.add_argument("--out", required=True, help="the .gguf file to write")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from tandem.models import resolve

    loc = resolve("default")
    hidden, layers, heads, kv_heads, ffn = SIZES[args.params]
    path = write(args.out, arch="llama", hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, ffn=ffn,
                 context=8192, kinds=Q4_K_M, tokenizer_from=loc.directory / loc.gguf_file, seed=args.seed,
                 name=f"random llama {args.params}", std=1.0 / math.sqrt(hidden))
    vocab = 49152
    print(f"{path}: {parameters(hidden, layers, heads, kv_heads, ffn, vocab) / 1e9:.2f} B parameters, "
          f"{path.stat().st_size / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
