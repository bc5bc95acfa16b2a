"""Prompt lookup as a drafter wrapper: tokens copied from the context first, the inner drafter drafts the rest.

``LookupDrafter(inner)`` serves any ``ContextDrafter``: it shares the inner drafter's sessions and
info, finds the context's last recurring n-gram (drafter_service.lookup) and proposes what followed it
as point masses (``from_lookup`` True), then asks the inner drafter to continue after them. Tokens
found by an n-gram shorter than ``trust_ngram`` are checked when the inner drafter can score tokens
(``can_check``): ``inner.check_tokens`` feeds context + lookup tokens once, and lookup keeps them while
the inner drafter's top token agrees or its top probability is below ``check_confidence``; the inner
drafter then drafts from where the kept tokens end, on the same run's logits. An inner drafter that
cannot score leaves lookup unchecked. Exact: see drafter_service.lookup.
"""

from __future__ import annotations

import dataclasses

from drafter_service.drafter import ContextDrafter, DraftState
from drafter_service.lookup import checked_length
from tandem.lookup import find_lookup, lookup_proposal
from tandem.types import DraftToken, LookupRule, ModelInfo, SamplingParams


class LookupDrafter(ContextDrafter):
    """Prompt lookup in front of ``inner``; ``max_ngram`` 0 turns lookup off (inner alone)."""

    kind = "lookup"

    def __init__(self, inner: ContextDrafter, *, max_ngram: int = 4, min_ngram: int = 2, trust_ngram: int = 1,
                 check_confidence: float = 0.5):
        if not isinstance(inner, ContextDrafter):
            raise TypeError(f"prompt lookup wraps a ContextDrafter (it needs each session's context), "
                            f"not {type(inner).__name__}")
        if not 0.0 <= check_confidence <= 1.0:
            raise ValueError(f"lookup_check_confidence must be in [0, 1], got {check_confidence}")
        self.inner = inner
        self.sessions = inner.sessions
        self.max_ngram, self.min_ngram = int(max_ngram), max(1, int(min_ngram))
        self.trust_ngram = int(trust_ngram)
        self.check_confidence = float(check_confidence)
        self._info: tuple[ModelInfo, ModelInfo] | None = None       # (inner's info, with the lookup rule)

    @property
    def info(self) -> ModelInfo:
        """The inner drafter's, with this lookup's rule (the gateway predicts and copies with it)."""
        inner = self.inner.info
        if not self.max_ngram:
            return inner
        if self._info is None or self._info[0] is not inner:
            trust = self.trust_ngram if self.inner.can_check else 1   # unchecked when the model cannot score
            self._info = (inner, dataclasses.replace(inner, lookup=LookupRule(self.max_ngram, self.min_ngram, trust)))
        return self._info[1]

    @property
    def can_check(self) -> bool:
        return self.inner.can_check

    def new_state(self) -> DraftState:
        return self.inner.new_state()

    def drop_cache(self, state: DraftState) -> None:
        self.inner.drop_cache(state)

    def context_followed(self, state: DraftState) -> None:
        self.inner.context_followed(state)

    def check_tokens(self, state, context, tokens, decide) -> int:
        return self.inner.check_tokens(state, context, tokens, decide)

    def draft_block(self, state: DraftState, context: list[int], k: int, sampling: SamplingParams,
                    min_confidence: float = 0.0, *, offset: int = 0) -> list[DraftToken]:
        if not self.max_ngram:
            return self.inner.draft_block(state, context, k, sampling, min_confidence, offset=offset)
        looked, ngram = find_lookup(context, k, self.max_ngram, self.min_ngram)
        checked = bool(looked) and ngram < self.trust_ngram and self.inner.can_check
        if checked and self.info.max_context:   # the check feeds every lookup token: stay within the context
            looked = looked[:max(0, self.info.max_context - len(context))]
            checked = bool(looked)
        if len(looked) == k and not checked:
            return lookup_proposal(looked, sampling)     # no model run: the inner cache catches up next time
        if checked:
            kept = self.inner.check_tokens(
                state, context, looked,
                lambda top_ids, top_probs: checked_length(looked, top_ids, top_probs, self.check_confidence))
        else:
            kept = len(looked)
        tokens = lookup_proposal(looked[:kept], sampling)
        if kept == k:
            return tokens
        return tokens + self.inner.draft_block(state, context + looked[:kept], k - kept, sampling, min_confidence,
                                               offset=offset + kept)
