"""Probing: a block now and then while plain decoding wins, so text that turns predictable gets speculation back.

While the choice picks k = 0 the session's acceptance estimates would never move (only blocks are
observed). So once the rounds since the drafter last drafted reach the schedule's ``interval``, the
round's plain choice is replaced by a probe block:

- its length: the k in 1..min(``ProbeRule.max_length``, the round's budget) that would bring the most
  tokens per ms if the text had turned predictable (its model tokens accepted at ``ProbeRule.acceptance``,
  or the estimates where higher), since that is what a probe asks: short where verify grows steeply with
  width, longer where the drafter's round trip is long and a short block cannot pay for it. A block the
  gateway would copy itself is no probe of the drafter: a probe is longer than the copy on offer, and a
  copied block neither probes nor resets the schedule (the rounds since the drafter drafted go on). Where
  no block longer than the copy can be had (``--lookup-only``: no drafter; a model-free node whose path
  is no longer than the copy), the probe is the copy itself (or the path): else copies whose estimate fell
  once would never be tried again, and every later session of the gateway would step plainly. Not beside a
  followed model node (``ProbeRule.copies`` off: the target's own file drafting ahead): there a plain round
  means its path has not arrived yet (after a rejection), not that plain decoding wins, and a copy probed
  there, where the model itself was just wrong, is kept about one token in ten (BENCHMARKS.md, twenty-ninth
  session).
- its verdict: the probes' realized tokens per ms (decayed by ``ProbeRule.decay``, so one lucky block is
  no trend) against a plain step's expected tokens per ms. A win resets the interval to
  ``ProbeRule.every``, as does a block the choice itself picked that beats a plain step (one that loses
  leaves the schedule alone). A loss doubles the interval, bounded by ``ProbeRule.cap`` and by what a
  refused probe costs: its extra time over a plain step, in plain rounds (predicted, and as measured:
  round_ms x the plain rate - 1), divided by ``ProbeRule.budget``; and it is at least what keeps the
  refused probes' extra time since the last reset within ``ProbeRule.budget`` of the rounds since then.
  So, from the first probe on, probing a drafter that never pays costs about ``ProbeRule.budget`` of
  plain throughput at worst, and a probe that costs little beyond a plain step comes often.

The schedule's state (``ProbeSchedule``) is gateway-wide, one per sampling mode: the rounds since the
drafter last drafted count across requests, so requests shorter than the interval still get probed, and a
new request starts where the last ones left the interval. A request reads the interval when it starts
(``Prober``) and writes back every change it makes to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from gateway.draft_length.acceptance import AcceptanceEstimator
from gateway.draft_length.choice import Decision, expected_prefixes
from gateway.draft_length.figures import RoundFigures


@dataclass(frozen=True)
class ProbeRule:
    """The probe schedule's parameters (the module docstring)."""

    every: int = 4              # the interval after a reset, and the shortest one a request starts at
    cap: int = 256              # the longest interval
    max_length: int = 8         # the longest probe block
    acceptance: float = 0.8     # the acceptance a probe's length is chosen for (predictable text)
    budget: float = 0.005       # worst-case share of plain throughput spent on refused probes (0: doubling alone)
    decay: float = 0.5          # weight of earlier probes in the probes' realized tokens per ms
    copies: bool = True         # a copy may be the probe where no longer block is on offer


@dataclass
class ProbeSchedule:
    """The probe schedule's state, shared by the auto requests of one sampling mode."""

    interval: int | None = None     # plain rounds between probes (None: not set yet, a request starts at every)
    streak: int = 0                 # rounds since the drafter last drafted
    rounds: int = 0                 # rounds with room to draft since the last reset
    spent: float = 0.0              # refused probes' extra time since the last reset, in plain rounds


class _Pending(NamedTuple):
    """A round whose verdict its figures decide: a probe, or a block the choice picked."""

    probe: bool
    plain_rate: float           # a plain step's expected tokens per ms: what the round must beat
    cost_bound: int = 0         # probe: the longest interval its predicted extra time allows within the budget


class Prober:
    """One request's side of the probe schedule: ``step`` every round after the choice, ``observe`` after it."""

    def __init__(self, rule: ProbeRule, schedule: ProbeSchedule):
        self.rule, self.schedule = rule, schedule
        start = rule.every if schedule.interval is None else schedule.interval
        self.interval = max(rule.every, min(int(start), rule.cap))
        self._pending: _Pending | None = None
        self._tokens = self._ms = 0.0       # the probes' decayed realized tokens and ms since the last reset

    def begin_round(self) -> None:
        """Drops the verdict of a round that was never observed (its drafter call failed)."""
        self._pending = None

    def due(self) -> bool:
        """Whether a plain choice this round would be probed."""
        return self.schedule.streak + 1 >= self.interval

    def step(self, d: Decision, budget: int, copied: int, acceptance: AcceptanceEstimator) -> Decision:
        """Counts the round chosen as ``d`` (``copied``: the longest block the gateway copies itself this
        round); returns the probe block instead of ``d`` when one is due."""
        s = self.schedule
        if budget == 0:
            pass                                # no room to draft (a request's last round): no evidence
        elif 0 < d.k <= copied:
            s.streak += 1                       # the drafter did not draft
        elif d.k > 0:
            s.streak = 0
            if d.candidates:
                self._pending = _Pending(False, d.candidates[0].tokens_per_ms)
        else:
            s.streak += 1
            if s.streak >= self.interval:
                probe = self._probe(d, budget, copied, acceptance)
                if probe is not None:           # else: the next round probes
                    s.streak = 0
                    d = probe
        if budget:
            s.rounds += 1
        return d

    def _probe(self, d: Decision, budget: int, copied: int, acceptance: AcceptanceEstimator) -> Decision | None:
        blocks = d.candidates[1:min(self.rule.max_length, budget) + 1]
        eligible = [c for c in blocks if c.k > copied] or (blocks if self.rule.copies else [])  # else: the copy
        if not eligible:
            return None
        hoped = expected_prefixes([max(a, self.rule.acceptance) for a in acceptance.model_acceptances(eligible[-1].k)])
        probe = max(eligible, key=lambda c: hoped[c.k] / c.expected_ms)
        plain = d.candidates[0]
        extra = probe.expected_ms / plain.expected_ms - 1.0
        bound = (max(1, math.ceil(extra / self.rule.budget)) if math.isfinite(extra) and self.rule.budget > 0
                 else self.rule.cap)
        self._pending = _Pending(True, plain.tokens_per_ms, bound)
        return Decision(probe.k, probe.expected_tokens, probe.expected_ms, probe.tokens_per_ms, d.candidates, "probe",
                        probe.ready)

    def observe(self, fig: RoundFigures) -> None:
        """The verdict of the round the last ``step`` counted, if it was a probe or a chosen block."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if not pending.probe:
            if (fig.accepted + 1) / max(1e-9, fig.round_ms) >= pending.plain_rate:
                self._reset()
            return
        self._tokens = self.rule.decay * self._tokens + fig.accepted + 1
        self._ms = self.rule.decay * self._ms + max(1e-9, fig.round_ms)
        if self._tokens / self._ms >= pending.plain_rate:
            self._reset()
        else:
            self._back_off(pending, extra=max(0.0, max(1e-9, fig.round_ms) * pending.plain_rate - 1.0))

    def _back_off(self, pending: _Pending, extra: float) -> None:
        """After a refused probe that cost ``extra`` plain rounds more than a plain step."""
        s, budget = self.schedule, self.rule.budget
        interval, bound = self.interval * 2, pending.cost_bound
        if budget > 0:
            bound = max(bound, math.ceil(extra / budget))
            s.spent += extra
            interval = max(interval, math.ceil(s.spent / budget - s.rounds))
        self._set_interval(max(1, min(interval, self.rule.cap, bound)))

    def _reset(self) -> None:
        self._set_interval(self.rule.every)
        self.schedule.rounds, self.schedule.spent = 0, 0.0
        self._tokens = self._ms = 0.0

    def _set_interval(self, interval: int) -> None:
        self.interval = self.schedule.interval = interval
