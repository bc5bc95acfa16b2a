"""The vocabulary fingerprint drafter and verifier compare before speculating together."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping


def vocab_hash(vocab: Mapping[str, int], special_tokens: Mapping[str, int | None] | None = None) -> str:
    """sha256 over (token, id) pairs sorted by id, plus named special-token ids.

    Two tokenizers with the same hash map every string to the same ids, so a drafter's token ids
    mean the same thing to the target.
    """
    h = hashlib.sha256()
    for token, idx in sorted(vocab.items(), key=lambda kv: (kv[1], kv[0])):
        h.update(json.dumps([idx, token], ensure_ascii=False).encode())
        h.update(b"\n")
    h.update(json.dumps(dict(sorted((special_tokens or {}).items()))).encode())
    return "sha256:" + h.hexdigest()


def tokenizer_vocab_hash(tokenizer) -> str:
    """vocab_hash of a transformers tokenizer (or anything with get_vocab and bos/eos ids)."""
    specials = {"bos_token_id": getattr(tokenizer, "bos_token_id", None),
                "eos_token_id": getattr(tokenizer, "eos_token_id", None)}
    return vocab_hash(tokenizer.get_vocab(), specials)
