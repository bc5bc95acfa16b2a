"""The choice of k: the draft length with the most expected tokens per expected millisecond.

For every k in 0..budget

    E[tokens | k] = 1 + sum_{j=1..k} prod_{i<=j} a_i          (acceptance.py)
    E[ms | k]     = the cost model's expected round time      (cost.py)

and the choice is the k that maximises E[tokens | k] / E[ms | k] (ties: the smaller k). Maximising the
ratio per round maximises long-run throughput (renewal-reward: each round is one renewal cycle whose
reward is the tokens it emits and whose length is its wall time).

A block's head may be prompt-lookup copies predicted by the gateway (``lookup_available`` tokens found
by an ``lookup_ngram``-token match):

- fetched from the drafter, they arrive as copies with the learned lookup yield y; otherwise the
  drafter drafts those positions with its model: tokens and ms are the y-weighted mix of the two;
- with ``local_lookup`` a block of k <= lookup_available is copied by the gateway itself, with
  certainty and without a drafter call (``CostModel.copied_round_curve``).

Tokens the drafter drafted ahead of this round, from the real context (``ready``: each one's copy flag,
gateway.proposal), are already at the gateway: a block of k <= len(ready) costs what a copied block costs
(verify + the plain overhead, no drafter time, no round trip to the drafter), each token with the acceptance
of its kind (a copy's, a suffix copy's for its match length ``ready_matches``, or the model position's); a
longer one pays the drafter's time for its other tokens. Where the gateway could also copy a block of k
itself, the two cost the same and the one expected to keep more is chosen (``Candidate.ready``).

A block that calls a drafter which is behind pays the catch-up (``CostModel.catch_up_ms``) in
proportion to the share of the request's ``remaining`` tokens it is expected to bring, since the
drafter stays caught up for the rounds after (all of it when the rest is unknown).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from gateway.draft_length.acceptance import AcceptanceEstimator
from gateway.draft_length.cost import CostModel


def expected_tokens(acceptances: Sequence[float]) -> float:
    """E[tokens emitted by a round] = 1 + sum_j prod_{i<=j} a_i (the recovered/bonus token included)."""
    return expected_prefixes(acceptances)[-1]


def expected_prefixes(acceptances: Sequence[float]) -> list[float]:
    """[expected_tokens(acceptances[:j]) for j in 0..len(acceptances)] in one pass."""
    out, total, run = [1.0], 1.0, 1.0
    for a in acceptances:
        run *= a
        total += run
        out.append(total)
    return out


class Candidate(NamedTuple):
    """One k the choice weighed (a tuple: every k up to the budget is built every round). ``ready``: the block
    is the tokens drafted ahead, although the gateway could copy one of k itself."""

    k: int
    expected_tokens: float
    expected_ms: float
    tokens_per_ms: float
    ready: bool = False


@dataclass(frozen=True)
class Decision:
    """The k of one round, what it is expected to bring, every candidate weighed, and why it was chosen:
    best (the choice), probe (probing.py), pinned (a fixed k), no-figures (no verify cost known yet: the
    fallback k), no-budget (no room to draft: a plain step)."""

    k: int
    expected_tokens: float
    expected_ms: float
    tokens_per_ms: float
    candidates: tuple[Candidate, ...] = ()
    reason: str = "best"
    ready: bool = False                 # the block is the tokens drafted ahead rather than the gateway's copy


def candidates(cost: CostModel, acceptance: AcceptanceEstimator, ks: Sequence[int], lookup_available: int,
               lookup_ngram: int = 0, local_lookup: bool = False, catch_up_ms: float = 0.0,
               remaining: int = 0, ready: Sequence[bool] = (), ready_matches: Sequence[int] = ()
               ) -> tuple[Candidate, ...]:
    """The expected tokens and ms of a block of each k in ``ks`` (the module docstring's rule)."""
    lookup = max(0, int(lookup_available))
    top = max(ks, default=0)
    # model[:k] and lookup[:n] + model[:k - n] blocks' expected tokens, from running products (O(top) a round)
    model = expected_prefixes(acceptance.model_acceptances(top))
    a_lookup = acceptance.lookup_acceptance(lookup_ngram) if lookup else 0.0
    copies = expected_prefixes([a_lookup] * min(lookup, top))
    y = acceptance.lookup_yield() if lookup else 0.0
    drafted = cost.round_curve(top)
    with_copies = cost.round_curve(top, lookup) if lookup and y > 0 else drafted
    copied_ms = cost.copied_round_curve(top) if (local_lookup and lookup) or ready else None
    held = _ready_prefixes(acceptance, ready, ready_matches) if ready else None
    out = []
    for k in ks:
        n_lookup = min(lookup, k)
        tokens, ms = model[k], drafted[k]
        if local_lookup and 0 < k <= lookup:        # the gateway copies the block itself, or takes the tokens
            if k <= len(ready) and held[k] > copies[k]:     # drafted ahead where they are expected to keep more
                out.append(Candidate(k, held[k], copied_ms[k], held[k] / max(1e-9, copied_ms[k]), True))
                continue
            tokens, ms = copies[k], copied_ms[k]
        elif 0 < k <= len(ready):                   # drafted ahead: already here
            tokens, ms = held[k], copied_ms[k]
        else:
            if k and ready:                         # the tokens drafted ahead cost nothing more
                ms -= len(ready) * cost.draft_ms_per_token
            if n_lookup and y > 0:
                # E[copies then model tokens] = E[copies] + P(all n copies accepted) * (E[model tokens] - 1)
                tokens = y * (copies[n_lookup] + a_lookup ** n_lookup * (model[k - n_lookup] - 1.0)) + (1 - y) * tokens
                ms = y * with_copies[k] + (1 - y) * ms
            if k and catch_up_ms:
                ms += catch_up_ms * (min(1.0, tokens / remaining) if remaining > 0 else 1.0)
        ms = max(1e-9, ms)
        out.append(Candidate(k, tokens, ms, tokens / ms))
    return tuple(out)


def _ready_prefixes(acceptance: AcceptanceEstimator, ready: Sequence[bool], matches: Sequence[int] = ()) -> list[float]:
    """Expected tokens of blocks of the first 0..len(ready) tokens drafted ahead: copies (True) at the acceptance
    of their match length where reported (``matches``), else at the copies' acceptance; the others at their
    model positions'."""
    models = iter(acceptance.model_acceptances(sum(1 for copy in ready if not copy)))
    copy = acceptance.lookup_acceptance()
    rates = []
    for i, is_copy in enumerate(ready):
        match = matches[i] if i < len(matches) else 0
        rates.append((acceptance.match_acceptance(match) if match > 0 else copy) if is_copy else next(models))
    return expected_prefixes(rates)


def choose_k(cost: CostModel, acceptance: AcceptanceEstimator, budget: int, lookup_available: int = 0,
             lookup_ngram: int = 0, local_lookup: bool = False, catch_up_ms: float = 0.0,
             remaining: int = 0, ready: Sequence[bool] = (), ready_matches: Sequence[int] = ()) -> Decision:
    """The k in 0..budget with the most expected tokens per ms (ties: the smaller k); the module docstring
    says what ``lookup_available``, ``lookup_ngram``, ``local_lookup``, ``catch_up_ms``, ``remaining``,
    ``ready`` and ``ready_matches`` change."""
    budget = max(0, int(budget))
    cands = candidates(cost, acceptance, range(budget + 1), lookup_available, lookup_ngram, local_lookup,
                       catch_up_ms, remaining, ready, ready_matches)
    best = cands[0]
    for c in cands[1:]:
        if c.tokens_per_ms > best.tokens_per_ms * (1.0 + 1e-9):
            best = c
    return Decision(best.k, best.expected_tokens, best.expected_ms, best.tokens_per_ms, cands,
                    "best" if budget > 0 else "no-budget", best.ready)
