"""The draft-length policy of one request: ``next_k`` before each round, ``observe`` after it.

- ``PinnedDraftLength``: a fixed k, cut to the round's budget. It still learns from every round, so
  the gateway-wide cost model and acceptance figures stay current.
- ``AutoDraftLength``: every round, in order,
  1. a held plain choice, if one stands for this round's room to draft (below);
  2. else weigh: ``choose_k`` over 0..min(budget, ``max_draft_length``);
  3. probe: the probe schedule may replace a plain choice by a probe block (``probing``).
  While no verify cost is known at all it drafts ``fallback_k`` (reason "no-figures").

Holding a plain choice: on a round that observes no block the session's acceptance moves by at most
``relax`` (``AcceptanceEstimator.relax``), so a plain choice that beat the best block by a share m cannot
flip for about m / relax rounds. It is reused for that many rounds, at most ``plain_hold_max``, for the
same budget and lookup match, while no block has been observed since, the drafter has no less context
to catch up on, and no probe is due.

Both learn the same way: the figures of a round are completed with what the policy knew when it chose
k (the lookup tokens it predicted and their match length, the context the drafter was behind by; a
drafter's copies past that prediction count as its drafted tokens), then fed to the cost model and the
acceptance estimator; a round without a block relaxes the estimates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from gateway.draft_length.acceptance import AcceptanceEstimator
from gateway.draft_length.choice import Decision, candidates, choose_k
from gateway.draft_length.cost import CostModel
from gateway.draft_length.figures import RoundFigures
from gateway.draft_length.probing import Prober, ProbeRule, ProbeSchedule


class DraftLengthPolicy(Protocol):
    """What the round loop (``gateway.rounds``) asks of a draft-length policy."""

    def next_k(self, budget: int, lookup_available: int = 0, lookup_ngram: int = 0, local_lookup: bool = False,
               behind: int = 0, remaining: int = 0, ready: Sequence[bool] = (),
               ready_matches: Sequence[int] = ()) -> Decision:
        """The next round's k, at most ``budget`` (the request's k cut to its tokens and context left).
        ``lookup_available``: tokens prompt lookup copies at the block's head this round, found by an
        ``lookup_ngram``-token match; ``local_lookup``: a block of at most that many is copied by the
        gateway itself, without a drafter call. ``behind``: context tokens the drafter has not seen (it
        reads them before drafting); ``remaining``: tokens the request may still emit; ``ready``: the tokens the
        drafter drafted ahead of this round from the real context, already at the gateway (each one's copy
        flag: a point mass copied from text, or a model token), and ``ready_matches`` each copy's match length
        where the drafter reported one (suffix drafting; 0: none)."""

    @property
    def expects_drafting(self) -> bool:
        """Whether the request is likely to draft soon (the drafter then reads the prompt during the prefill)."""

    def observe(self, fig: RoundFigures) -> None:
        """The figures of the round the last ``next_k`` chose k for (none for a failed drafter call)."""


class _Learning:
    """What both policies share: the round's context between ``next_k`` and ``observe``, and learning."""

    def __init__(self, cost: CostModel, acceptance: AcceptanceEstimator, relax: float):
        self.cost, self.acceptance, self.relax = cost, acceptance, relax
        self._lookup_predicted = 0      # the last next_k's lookup tokens available
        self._lookup_ngram = 0          # and the n-gram length they were found by
        self._behind = 0                # the last next_k's context tokens unseen by the drafter

    def _begin(self, budget: int, lookup_available: int, lookup_ngram: int, behind: int) -> tuple[int, float]:
        """Records the round's context; returns the budget and the drafter's catch-up ms."""
        self._behind = max(0, int(behind))
        self._lookup_predicted = max(0, int(lookup_available))
        self._lookup_ngram = max(0, int(lookup_ngram)) if self._lookup_predicted else 0
        return max(0, int(budget)), self.cost.catch_up_ms(self._behind)

    def observe(self, fig: RoundFigures) -> None:
        done = self._completed(fig)
        self.cost.observe(done)
        if fig.matches and done.from_lookup != fig.from_lookup:
            # copies that came with their match length keep their flag: their acceptance is learned per length
            done = dataclasses.replace(done, from_lookup=tuple(
                flag or (m > 0 and orig) for flag, m, orig in zip(done.from_lookup, fig.matches, fig.from_lookup)))
        self.acceptance.observe(done)
        if not fig.width and self.relax:
            self.acceptance.relax(self.relax)

    def _completed(self, fig: RoundFigures) -> RoundFigures:
        """``fig`` with what this policy knows of the round and the figures lack.

        A drafter's copies beyond the head the gateway's lookup predicted (suffix drafting: point masses the
        gateway cannot foresee) are learned as drafter tokens, their cost and acceptance with the model's:
        the choice prices every token of a block past the predicted head at those figures, so learning them
        as lookup copies would leave a copying drafter's wait and round trip unpriced (a model-free node
        behind a 20 ms link was called every round at 4x a plain round's cost). Copies that came with their
        match length are the exception for acceptance only (``observe``): it is learned per match length."""
        extra = {}
        if fig.speculative and fig.width and any(fig.from_lookup):
            head = min(self._lookup_predicted, fig.width)
            flags = tuple(flag and i < head for i, flag in enumerate(fig.from_lookup))
            if flags != fig.from_lookup:
                extra["from_lookup"] = flags
        if fig.width and self._lookup_predicted:
            if not fig.lookup_ngram:    # the copies' acceptance is learned per match length, copied here or not
                extra["lookup_ngram"] = self._lookup_ngram
            # the lookup yield is the drafter's: a block the gateway copied itself says nothing about it
            if fig.speculative and not fig.lookup_predicted:
                extra["lookup_predicted"] = self._lookup_predicted
        if fig.speculative and fig.width and self._behind and not fig.catch_up:
            extra["catch_up"] = self._behind
        return dataclasses.replace(fig, **extra) if extra else fig


class PinnedDraftLength(_Learning):
    """Always ``k`` (cut to the round's budget), weighed like any candidate so the round reports what it expects."""

    def __init__(self, cost: CostModel, acceptance: AcceptanceEstimator, k: int, relax: float = 0.02):
        if k < 0:
            raise ValueError(f"a pinned draft length must be >= 0, got {k}")
        super().__init__(cost, acceptance, relax)
        self.k = int(k)

    def next_k(self, budget: int, lookup_available: int = 0, lookup_ngram: int = 0, local_lookup: bool = False,
               behind: int = 0, remaining: int = 0, ready: Sequence[bool] = (),
               ready_matches: Sequence[int] = ()) -> Decision:
        budget, catch_up = self._begin(budget, lookup_available, lookup_ngram, behind)
        k = min(self.k, budget)
        c, = candidates(self.cost, self.acceptance, (k,), self._lookup_predicted, self._lookup_ngram, local_lookup,
                        catch_up, remaining, ready, ready_matches)
        return Decision(k, c.expected_tokens, c.expected_ms, c.tokens_per_ms, (c,), "pinned", c.ready)

    @property
    def expects_drafting(self) -> bool:
        return self.k > 0


class _HeldPlainChoice:
    """Clear plain choices, per room, and the last round each stands for (the policy module's docstring)."""

    def __init__(self, max_rounds: int, relax: float):
        self.max_rounds, self.relax = max_rounds, relax
        self._round = 0
        # (budget, lookup tokens, their match length, local lookup) -> (plain choice, last round, catch-up ms)
        self._held: dict[tuple, tuple[Decision, int, float]] = {}

    def next_round(self, room: tuple, catch_up: float) -> Decision | None:
        """Counts a round; the plain choice held for ``room`` (the round's budget and lookup match), if it
        still stands."""
        self._round += 1
        held = self._held.get(room)
        if held is not None and self._round <= held[1] and catch_up >= held[2]:
            return held[0]
        return None

    def keep(self, room: tuple, d: Decision, catch_up: float) -> None:
        """Holds ``d`` for the rounds its margin lasts, if it is a plain choice."""
        if d.k != 0 or len(d.candidates) < 2 or not self.max_rounds:
            return
        plain = d.candidates[0].tokens_per_ms
        rival = max(c.tokens_per_ms for c in d.candidates[1:])
        margin = 1.0 - rival / plain if plain > 0 else 0.0
        rounds = max(0, min(self.max_rounds, int(margin / max(self.relax, 0.01))))
        if rounds:
            self._held[room] = (d, self._round + rounds, catch_up)

    def clear(self) -> None:
        self._held.clear()


class AutoDraftLength(_Learning):
    """The k of each round from the measured costs and the session's acceptance (the module docstring).

    ``schedule``: the gateway-wide probe schedule of the request's sampling mode (a request of its own
    without one)."""

    def __init__(self, cost: CostModel, acceptance: AcceptanceEstimator, max_draft_length: int = 8,
                 probing: ProbeRule = ProbeRule(), schedule: ProbeSchedule | None = None, fallback_k: int = 2,
                 plain_hold_max: int = 8, relax: float = 0.02):
        super().__init__(cost, acceptance, relax)
        self.max_draft_length = max_draft_length    # the longest block it drafts (--max-draft-length)
        self.fallback_k = fallback_k                # drafted while no verify cost is known at all
        self._prober = Prober(probing, schedule if schedule is not None else ProbeSchedule())
        self._held = _HeldPlainChoice(plain_hold_max, relax)

    def next_k(self, budget: int, lookup_available: int = 0, lookup_ngram: int = 0, local_lookup: bool = False,
               behind: int = 0, remaining: int = 0, ready: Sequence[bool] = (),
               ready_matches: Sequence[int] = ()) -> Decision:
        budget, catch_up = self._begin(budget, lookup_available, lookup_ngram, behind)
        self._prober.begin_round()
        if budget and not self.cost.ready:
            k = min(self.fallback_k, budget)
            return Decision(k, float("nan"), float("nan"), float("nan"), (), "no-figures")
        room = (budget, self._lookup_predicted, self._lookup_ngram, local_lookup, tuple(ready[:budget]),
                tuple(ready_matches[:budget]))
        held = self._held.next_round(room, catch_up)
        d = held if held is not None and not self._prober.due() else self._weigh(room, catch_up, remaining)
        return self._prober.step(d, budget, self._lookup_predicted if local_lookup else 0, self.acceptance)

    @property
    def expects_drafting(self) -> bool:
        """The drafter drafted in the gateway's last few rounds (not in a plain streak)."""
        return self._prober.schedule.streak < self._prober.rule.every

    def _weigh(self, room: tuple, catch_up: float, remaining: int) -> Decision:
        budget, lookup, ngram, local, ready, matches = room
        d = choose_k(self.cost, self.acceptance, min(budget, self.max_draft_length), lookup, ngram, local, catch_up,
                     remaining, ready, matches)
        self._held.keep(room, d, catch_up)
        return d

    def observe(self, fig: RoundFigures) -> None:
        super().observe(fig)
        if fig.width:
            self._held.clear()          # a block's evidence can move the estimates by more than relax
        self._prober.observe(fig)
