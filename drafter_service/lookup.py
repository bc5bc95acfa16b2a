"""Checked prompt lookup (the rule itself: ``tandem.lookup``).

A token prompt lookup found by a short n-gram (shorter than ``lookup_trust_ngram``) is kept only while the
drafter's own top token agrees with it or the drafter is unsure (top probability below
``lookup_check_confidence``); at the first confident disagreement the model drafts from there
(``drafter_service.lookup_drafter``). The check is a deterministic function of the context, so a kept token
is still a point mass and a dropped one is replaced by a model token sampled from the q that is reported:
exact.
"""

from __future__ import annotations

from collections.abc import Sequence


def checked_length(looked: Sequence[int], top_ids: Sequence[int], top_probs: Sequence[float],
                   confidence: float) -> int:
    """How many lookup tokens survive the check: token j is kept while the drafter's top token at its
    position (``top_ids[j]``, given the context and the kept tokens before it) is the same token, or the
    drafter's top probability there (``top_probs[j]``) is below ``confidence``."""
    for j, tok in enumerate(looked):
        if int(top_ids[j]) != int(tok) and float(top_probs[j]) >= confidence:
            return j
    return len(looked)
