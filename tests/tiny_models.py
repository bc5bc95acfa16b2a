"""Tiny random-weight Llama models with a shared word-level tokenizer, for fast deterministic tests.

``make_tiny_model(dir, seed, ...)`` writes a Hugging Face model directory (config, weights,
tokenizer) that ``tandem.models.load_causal_lm(dir)`` loads like any real model; ``tiny_served_gguf(path)`` a
tiny GGUF with the default target's tokenizer, for served verifiers.
"""

from __future__ import annotations

from pathlib import Path

TINY_VOCAB = 64
SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2


def tiny_words(vocab_size: int = TINY_VOCAB) -> list[str]:
    return SPECIALS + [f"w{i}" for i in range(vocab_size - len(SPECIALS))]


def make_tokenizer(vocab_size: int = TINY_VOCAB):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(tiny_words(vocab_size))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = "{% for m in messages %}<s> {{ m['content'] }} {% endfor %}"
    return fast


def make_tiny_model(out: Path, seed: int = 0, vocab_size: int = TINY_VOCAB, hidden: int = 32, layers: int = 2,
                    heads: int = 4, kv_heads: int = 2, max_positions: int = 256, logit_scale: float = 1.0) -> Path:
    """Saves a random LlamaForCausalLM + tokenizer to ``out`` and returns it.

    ``logit_scale`` multiplies the output head so that distributions are more or less peaked.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=max_positions, bos_token_id=1, eos_token_id=2, pad_token_id=2,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
        model.lm_head.weight.mul_(logit_scale)
    model.save_pretrained(out)
    make_tokenizer(vocab_size).save_pretrained(out)
    return out


# Tiny GGUF files: one block type per tensor kind (a K-quant mix, as in a Q4_K_M file), and the head sizes
# transformers' GGUF loader assumes (Qwen3: 128; Gemma 3: 256)
GGUF_MIX = {"default": "Q8_0", "attn_output": "Q4_K", "ffn_down": "Q6_K", "ffn_gate": "Q5_0", "attn_q": "Q4_1"}
GGUF_ARCHS = {
    "llama": dict(heads=4, kv_heads=2),
    "qwen2": dict(heads=4, kv_heads=2),
    "qwen3": dict(heads=2, kv_heads=1, head_dim=128),
    "gemma3": dict(heads=2, kv_heads=1, head_dim=256, layers=6, window=8),
    "mistral-window": dict(heads=4, kv_heads=2, window=6),
}


def tiny_served_gguf(path: Path) -> Path:
    """A tiny random Q4_1 Llama GGUF (hidden 128) carrying the default target's tokenizer: a real one, so a
    served verifier and the HTTP API (its chat template) work on it. Written to ``path``."""
    from tandem.bench.random_gguf import write
    from tandem.models import resolve

    default = resolve("default")
    return write(path, arch="llama", hidden=128, heads=2, kv_heads=1, ffn=256, std=0.3, kinds={"default": "Q4_1"},
                 seed=3, tokenizer_from=default.directory / default.gguf_file)
