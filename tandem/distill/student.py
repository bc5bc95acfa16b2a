"""Building the drafter ("student"): a small LlamaForCausalLM with the target's tokenizer.

* Embeddings are initialised from a low-rank projection of the target's input embeddings: the top
  ``hidden`` right-singular vectors V of the target's embedding matrix E (vocab x H_target), student
  embedding = E @ V (the PCA coordinates of every token, uncentred). The output head starts from the
  same rows, so the student's first logits already resemble a rank-``hidden`` version of the target's
  tied head.
* A reduced *draft vocabulary* (the most frequent target tokens in the training data plus all special
  tokens) keeps the output head small: the drafter only ever proposes tokens in it. The mapping draft
  index -> target id is saved as ``draft_vocab.npy`` (int64, sorted) and named in config.json as
  ``tandem_draft_vocab``. Exactness is unaffected: the drafter reports q over exactly the tokens it can
  propose (q = 0 elsewhere).

The Hugging Face directory keeps the full target vocabulary for the input embedding (any target token
may appear in the context) and a full-size ``lm_head``; only the rows listed in ``draft_vocab.npy``
are trained (the others hold their initial values and must be ignored: export slices the head to the
draft rows, so the ONNX logits have ``len(draft_vocab)`` columns).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

DRAFT_VOCAB_FILE = "draft_vocab.npy"
CONFIG_KEY = "tandem_draft_vocab"


@dataclass
class StudentSpec:
    hidden: int = 384
    layers: int = 4
    heads: int = 6
    kv_heads: int = 2
    intermediate: int = 1024
    draft_vocab: int = 16384  # 0 = the full target vocabulary
    max_positions: int = 0  # 0 = the target's

    def to_dict(self) -> dict:
        return asdict(self)


def special_ids(tokenizer) -> set[int]:
    ids = set()
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        v = getattr(tokenizer, name, None)
        if isinstance(v, int):
            ids.add(v)
    for v in getattr(tokenizer, "all_special_ids", []) or []:
        ids.add(int(v))
    for t in getattr(tokenizer, "added_tokens_decoder", {}) or {}:
        ids.add(int(t))
    return ids


def choose_draft_vocab(counts: Counter, size: int, vocab_size: int, always: set[int] = frozenset()) -> np.ndarray:
    """The ``size`` most frequent ids (ties by id), plus ``always``; sorted int64. size 0 = everything."""
    if size <= 0 or size >= vocab_size:
        return np.arange(vocab_size, dtype=np.int64)
    keep = set(int(i) for i in always if 0 <= int(i) < vocab_size)
    for tok, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(keep) >= size:
            break
        keep.add(int(tok))
    i = 0
    while len(keep) < size:  # pad with the lowest ids (bytes and common merges) if the data is small
        keep.add(i)
        i += 1
    return np.array(sorted(keep), dtype=np.int64)


def low_rank_embeddings(target_embed, rank: int):
    """E @ V[:, :rank] where V are E's right-singular vectors (torch tensors); returns (vocab, rank)."""
    import torch

    E = target_embed.detach().float()
    if rank >= E.shape[1]:
        out = torch.zeros(E.shape[0], rank)
        out[:, :E.shape[1]] = E
        return out
    # The covariance is small (H x H): eigen-decompose it instead of a full SVD of E.
    cov = E.T @ E
    evals, evecs = torch.linalg.eigh(cov)
    V = evecs[:, evals.argsort(descending=True)[:rank]]
    return E @ V


def build_student(target, tokenizer, spec: StudentSpec, draft_vocab: np.ndarray, seed: int = 0):
    """A fresh LlamaForCausalLM drafter for ``target`` (an HF causal LM); returns the model."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tc = target.config
    vocab = tc.vocab_size
    head_dim = spec.hidden // spec.heads
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
        head_dim=head_dim, max_position_embeddings=spec.max_positions or getattr(tc, "max_position_embeddings", 2048),
        rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-5), rope_parameters=getattr(tc, "rope_parameters", None),
        bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id, pad_token_id=getattr(tc, "pad_token_id", None),
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        emb = low_rank_embeddings(target.get_input_embeddings().weight, spec.hidden)
        model.get_input_embeddings().weight.copy_(emb)
        t_in, t_out = target.get_input_embeddings().weight, target.get_output_embeddings().weight
        head = emb.clone() if t_out.data_ptr() == t_in.data_ptr() else low_rank_embeddings(t_out, spec.hidden)
        model.lm_head.weight.copy_(head / head.norm(dim=-1).mean().clamp(min=1e-6))  # logits of a few units
    model.config.update({CONFIG_KEY: DRAFT_VOCAB_FILE if len(draft_vocab) < vocab else None})
    return model


def save_student(model, tokenizer, draft_vocab: np.ndarray, out_dir: str | os.PathLike, extra: dict | None = None):
    """save_pretrained + tokenizer + draft_vocab.npy (when reduced) into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    reduced = len(draft_vocab) < model.config.vocab_size
    model.config.update({CONFIG_KEY: DRAFT_VOCAB_FILE if reduced else None})
    if extra:
        model.config.update(extra)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if reduced:
        np.save(out / DRAFT_VOCAB_FILE, draft_vocab.astype(np.int64))
    elif (out / DRAFT_VOCAB_FILE).exists():
        (out / DRAFT_VOCAB_FILE).unlink()
    return out


def load_draft_vocab(model_dir: str | os.PathLike, vocab_size: int | None = None) -> np.ndarray | None:
    """The draft vocabulary of a saved drafter directory (config.json ``tandem_draft_vocab`` names an
    int64 .npy of target ids), or None when it uses the full vocabulary.

    Raises ValueError unless the ids are sorted, unique and in [0, ``vocab_size``) (the config's
    ``vocab_size`` when not given).
    """
    d = Path(model_dir)
    cfg = json.loads((d / "config.json").read_text())
    name = cfg.get(CONFIG_KEY)
    if not name:
        return None
    ids = np.load(d / name).astype(np.int64)
    vocab = int(vocab_size if vocab_size is not None else cfg.get("vocab_size", 0) or 0)
    if ids.ndim != 1 or not len(ids) or (np.diff(ids) <= 0).any() or ids[0] < 0 or (vocab and ids[-1] >= vocab):
        raise ValueError(f"{d / name}: the draft vocabulary must be sorted unique target ids in [0, {vocab})")
    return ids


class DraftHead:
    """Helper: logits over the draft vocabulary from a drafter's last hidden states."""

    def __init__(self, model, draft_vocab: np.ndarray | None):
        import torch

        self.model = model
        self.ids = None if draft_vocab is None else torch.as_tensor(draft_vocab, dtype=torch.long)

    def weight(self):
        w = self.model.lm_head.weight
        return w if self.ids is None else w[self.ids]

    def to_target(self, idx):
        return idx if self.ids is None else self.ids[idx]


def build_student_from_target(target, layers: int, frozen: int, draft_vocab: np.ndarray):
    """A drafter made of the target's own first ``layers`` decoder layers (a truncated target).

    The token embedding, the first ``frozen`` layers and the rotary settings are copied from the
    target and frozen (``requires_grad=False``): they carry the target's pretrained knowledge, which a
    few hundred thousand distillation tokens cannot teach a fresh network. The layers above them, the
    final norm and the output head (started from the target's tied embedding rows) are trained to turn
    those features into the target's *final* next-token choice. Untrained, such a truncated target
    agrees with the full one on only ~5 % of greedy tokens here, so the trained top is essential.
    Returns a LlamaForCausalLM with the target's width.
    """
    import copy

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tc = target.config
    n_target = tc.num_hidden_layers
    if not 0 < layers <= n_target or not 0 <= frozen < layers:
        raise ValueError(f"need 0 < layers <= {n_target} and 0 <= frozen < layers (got {layers}, {frozen})")
    cfg = LlamaConfig(
        vocab_size=tc.vocab_size, hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
        num_hidden_layers=layers, num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=tc.num_key_value_heads, head_dim=getattr(tc, "head_dim", None)
        or tc.hidden_size // tc.num_attention_heads,
        max_position_embeddings=getattr(tc, "max_position_embeddings", 2048), rms_norm_eps=tc.rms_norm_eps,
        rope_parameters=getattr(tc, "rope_parameters", None), bos_token_id=tc.bos_token_id,
        eos_token_id=tc.eos_token_id, pad_token_id=getattr(tc, "pad_token_id", None), tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    src = target.model
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(src.embed_tokens.weight)
        for i in range(layers):
            model.model.layers[i].load_state_dict(copy.deepcopy(src.layers[i].state_dict()))
        model.model.norm.weight.copy_(src.norm.weight)
        model.lm_head.weight.copy_(target.get_output_embeddings().weight)
    model.model.embed_tokens.weight.requires_grad_(False)
    for i in range(frozen):
        for p in model.model.layers[i].parameters():
            p.requires_grad_(False)
    model.config.update({CONFIG_KEY: DRAFT_VOCAB_FILE if len(draft_vocab) < tc.vocab_size else None,
                         "tandem_init": {"from_target_layers": layers, "frozen_layers": frozen}})
    return model
