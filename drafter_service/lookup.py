"""Prompt lookup: free draft tokens copied from the context (Saxena 2023, "prompt lookup decoding").

If the last n tokens of the context occurred earlier in it, the tokens that followed them then are
a good guess for what follows now (quotes, names, code, summaries, and the repetition small models
fall into). Such a proposal is deterministic given the context, so the distribution it was drawn
from is a point mass: q = δ(x). Reporting exactly that keeps verification exact (the verifier
accepts x with probability p(x) and otherwise samples from p without x).

Checked lookup (drafter_service.lookup_drafter): a token found by a short n-gram (shorter than
``lookup_trust_ngram``) is kept only while the inner drafter's own top token agrees with it or the
drafter is unsure (top probability below ``lookup_check_confidence``, ``checked_length``); at the first
confident disagreement the inner drafter drafts from there. The check is a deterministic function of
the context, so a kept token is still a point mass and a dropped one is replaced by a model token
sampled from the q that is reported: exact.
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.lookup import find_lookup, prompt_lookup  # noqa: F401 - the finding itself is shared with the gateway


def checked_length(looked: Sequence[int], top_ids: Sequence[int], top_probs: Sequence[float],
                   confidence: float) -> int:
    """How many lookup tokens survive the check: token j is kept while the drafter's top token at its
    position (``top_ids[j]``, given the context and the kept tokens before it) is the same token, or the
    drafter's top probability there (``top_probs[j]``) is below ``confidence``."""
    for j, tok in enumerate(looked):
        if int(top_ids[j]) != int(tok) and float(top_probs[j]) >= confidence:
            return j
    return len(looked)
