"""What the verifier tells a gateway about its target: model info, and the tokenizer and chat template,
so the gateway tokenizes exactly as the target does.

``TokenizerInfo``: what of a tokenizer the verifier needs (it never tokenizes: the gateway does) -- the
vocabulary hash, the tokenizer as JSON, the chat template and the special tokens. A GGUF target's comes
from the file's converted tokenizer kept on disk (``gguf_model``), without a tokenizer object in the
verifier's memory (300 MB for a 262 k vocabulary); a Hugging Face target's from its loaded tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tandem.types import TargetInfo


@dataclass(frozen=True)
class TokenizerInfo:
    vocab_hash: str
    chat_template: str
    bos_token: str
    eos_token: str
    eos_token_ids: tuple[int, ...]
    json: Callable[[], str]                 # the tokenizer as tokenizers' JSON, read when asked for

    @classmethod
    def of(cls, tokenizer, eos_token_ids: tuple[int, ...]) -> "TokenizerInfo":
        from tandem.vocab import tokenizer_vocab_hash

        backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
        return cls(tokenizer_vocab_hash(tokenizer), tokenizer.chat_template or "", tokenizer.bos_token or "",
                   tokenizer.eos_token or "", eos_token_ids, lambda: backend.to_str() if backend is not None else "")


def describe(target) -> TargetInfo:
    tok = target.tokenizer_info
    return TargetInfo(model=target.info, tokenizer_json=tok.json(), chat_template=tok.chat_template,
                      bos_token=tok.bos_token, eos_token=tok.eos_token,
                      # the target's table is by forward width (positions); the wire's by draft tokens
                      verify_ms_by_width={w - 1: ms for w, ms in target.cost_table().items() if w >= 1})
