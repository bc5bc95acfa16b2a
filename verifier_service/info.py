"""What the verifier tells a gateway about its target: model info, and the tokenizer and chat template,
so the gateway tokenizes exactly as the target does."""

from __future__ import annotations

from tandem.types import TargetInfo


def describe(target) -> TargetInfo:
    tok = target.tokenizer
    backend = getattr(tok, "backend_tokenizer", None) or getattr(tok, "_tokenizer", None)
    return TargetInfo(model=target.info, tokenizer_json=backend.to_str() if backend is not None else "",
                      chat_template=tok.chat_template or "", bos_token=tok.bos_token or "",
                      eos_token=tok.eos_token or "",
                      # the target's table is by forward width (positions); the wire's by draft tokens
                      verify_ms_by_width={w - 1: ms for w, ms in target.cost_table().items() if w >= 1})
