"""The acceptance estimator: how many tokens a block of each draft length is expected to keep.

The figures are conditional acceptances, a_i = P(draft token i accepted | tokens < i accepted), so a
block of k is expected to emit E[tokens | k] = 1 + sum_{j=1..k} prod_{i<=j} a_i (the recovered or bonus
token included). Each is a decayed (exponentially weighted) share, censored correctly: a position after
the first rejection is not observed.

- Model-drafted tokens are indexed by their position among the block's model tokens (after a lookup
  prefix the drafter starts afresh from accepted context).
- Tokens copied by prompt lookup have their own acceptance, learned per length of the n-gram the match
  was found by (1, 2, 3 and 4+: a long match is usually right, a match on the last token alone often
  is not).
- Copies a drafter found by matching text (suffix drafting) and reported with their match length (the
  tokens before each that agreed with its source) have their own acceptance per match length (1-3, 4-7,
  8-15, 16-31, 32+): a copy standing on 32 tokens of text seen before word for word is nearly always right,
  one standing on 2 often is not, and the gateway sees the length before it chooses k (tokens drafted
  ahead).
- The lookup yield: the share of the lookup tokens the gateway predicted (it runs the drafter's lookup
  rule over the sequence it holds) that the drafter really sent as copies. A drafter that checks short
  matches against its model, or serves with lookup off, sends fewer; a predicted copy must not make a
  long block of the drafter's own tokens look nearly free.

A session's estimator starts from a gateway-wide one (its ``prior``) as pseudo-observations that decay
like real ones, so its first rounds are sane and its own rounds take over within a few; ``relax`` moves
stale session evidence back toward the prior on rounds that observe nothing. Beside a model-free node
(suffix drafting) the prior counts for less (``COPYING_PRIOR_WEIGHT``): whether its tokens are right depends
on whether this request's text passed through the node before, which other requests' rounds do not say. With
the default weight, after its first requests' blocks were rejected (new text), the gateway-wide figure kept
later sessions on plain steps even where the node held their whole answer, and one probe block that was all
accepted did not win them back (BENCHMARKS.md, twenty-third session).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.draft_length.figures import RoundFigures

_A_MIN, _A_MAX = 1e-3, 0.995
NGRAM_BUCKETS = 4               # lookup acceptance per match length 1, 2, 3 and 4+
PRIOR_WEIGHT = 3.0              # pseudo-observations a session's estimates start with from the gateway-wide ones
COPYING_PRIOR_WEIGHT = 0.3      # beside a model-free (suffix) node: the session's first block outweighs them


MATCH_EDGES = (1, 4, 8, 16, 32)  # a suffix copy's acceptance per match length: [1, 4), [4, 8), ..., [32, inf)


def _bucket(ngram: int) -> int:
    return min(max(0, int(ngram)), NGRAM_BUCKETS)


def match_bucket(length: int) -> int:
    """The bucket of a copy's match length: 1..len(MATCH_EDGES), 0 for none."""
    return sum(1 for edge in MATCH_EDGES if length >= edge)


@dataclass
class _Slot:
    """Decayed evidence for one conditional acceptance: ``s`` accepted of ``n`` observed, plus ``pw``
    pseudo-observations of the prior's value (which decay like real ones)."""

    pw: float
    s: float = 0.0
    n: float = 0.0
    t: int = 0              # raw observations

    def add(self, accepted: bool | float, decay: float) -> None:
        self.s = decay * self.s + float(accepted)      # a bool, or a fraction in [0, 1] (the lookup yield)
        self.n = decay * self.n + 1.0
        self.pw *= decay
        self.t += 1

    def relax(self, beta: float) -> None:
        moved = beta * self.n
        self.s *= 1.0 - beta
        self.n -= moved
        self.pw += moved

    def estimate(self, prior_value: float) -> float:
        total = self.n + self.pw
        return prior_value if total <= 0 else (self.s + self.pw * prior_value) / total


class AcceptanceEstimator:
    """Conditional acceptance per block position, decayed (module docstring).

    Without a ``prior`` the estimates start from the constants ``default`` (model tokens) and
    ``default_lookup``; ``prior_weight``: the pseudo-observations the prior's figures count as.
    ``observe`` also feeds the prior when ``share`` is set (the gateway-wide figures follow every session).
    """

    def __init__(self, alpha: float = 0.1, prior: "AcceptanceEstimator | None" = None, prior_weight: float = PRIOR_WEIGHT,
                 default: float = 0.6, default_lookup: float = 0.8, share: bool = True):
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha, self.prior, self.prior_weight = float(alpha), prior, float(prior_weight)
        self.default, self.default_lookup, self.share = float(default), float(default_lookup), share
        self._model: list[_Slot] = []   # per model position
        self._lookup = _Slot(self.prior_weight)          # every lookup token
        self._lookup_by_n = {n: _Slot(self.prior_weight) for n in range(1, NGRAM_BUCKETS + 1)}   # per match length
        self._yield = _Slot(self.prior_weight)   # share of predicted lookup tokens that arrived as lookup copies
        self._match = {b: _Slot(self.prior_weight) for b in range(1, len(MATCH_EDGES) + 1)}  # copies per match length
        self._version = 0                        # bumped by every change: model_acceptances is memoised on it
        self._memo: tuple | None = None

    # ---- learning ---------------------------------------------------------------------------------
    def _slot(self, i: int) -> _Slot:
        while len(self._model) <= i:
            self._model.append(_Slot(self.prior_weight))
        return self._model[i]

    def _add(self, i: int, accepted: bool) -> None:
        self._version += 1
        self._slot(i).add(accepted, 1.0 - self.alpha)

    def _add_lookup(self, accepted: bool, ngram: int = 0) -> None:
        self._version += 1
        self._lookup.add(accepted, 1.0 - self.alpha)
        if _bucket(ngram):
            self._lookup_by_n[_bucket(ngram)].add(accepted, 1.0 - self.alpha)

    def relax(self, beta: float = 0.02) -> None:
        """Moves a fraction ``beta`` of the session's own evidence back to the prior: called on rounds
        that observe nothing (plain rounds), so estimates that went stale while speculation was off
        drift back toward the gateway-wide figures instead of freezing at their last value."""
        self._version += 1
        for slot in (*self._model, self._lookup, *self._lookup_by_n.values(), self._yield, *self._match.values()):
            if slot.n:                  # a slot with no evidence of its own has none to move
                slot.relax(beta)

    def observe_block(self, from_lookup: Sequence[bool], accepted: int, ngram: int = 0,
                      matches: Sequence[int] = ()) -> None:
        """One verified block: flags per proposed token and the number accepted. Positions after the
        first rejection are not observed (the conditional is only defined given the prefix accepted).
        ``ngram``: the length of the n-gram the gateway's lookup prediction was found by (0: unknown);
        ``matches``: per token, a copy's match length (> 0: learned per match length, not as a lookup copy)."""
        model_index = 0
        for i, lookup in enumerate(from_lookup):
            if i > accepted:
                break
            if lookup and i < len(matches) and matches[i] > 0:
                self._version += 1
                self._match[match_bucket(matches[i])].add(i < accepted, 1.0 - self.alpha)
            elif lookup:
                self._add_lookup(i < accepted, ngram)
            else:
                self._add(model_index, i < accepted)
                model_index += 1
        if self.share and self.prior is not None:
            self.prior.observe_block(from_lookup, accepted, ngram, matches)

    def observe_lookup_yield(self, predicted: int, from_lookup: Sequence[bool]) -> None:
        """A block drafted after the gateway predicted ``predicted`` (> 0) lookup tokens at its head:
        learns the share that came as lookup copies (the leading ``from_lookup`` flags)."""
        if predicted <= 0:
            return
        arrived = 0
        for flag in list(from_lookup)[:predicted]:
            if not flag:
                break
            arrived += 1
        self._version += 1
        self._yield.add(arrived / predicted, 1.0 - self.alpha)
        if self.share and self.prior is not None:
            self.prior.observe_lookup_yield(predicted, from_lookup)

    def observe(self, fig: RoundFigures) -> None:
        if fig.width:
            self.observe_block(fig.from_lookup or (False,) * fig.width, fig.accepted, fig.lookup_ngram, fig.matches)
            if fig.lookup_predicted:
                self.observe_lookup_yield(min(fig.lookup_predicted, fig.width), fig.from_lookup)

    # ---- reading ----------------------------------------------------------------------------------
    def _own(self, i: int) -> _Slot:
        return self._model[i] if i < len(self._model) else _Slot(self.prior_weight)

    def model_acceptances(self, n: int) -> list[float]:
        """a_1..a_n of model-drafted tokens (their index among the block's model tokens).

        Each position shrinks toward its prior value: the prior estimator's figure at that position,
        or (no prior) this estimator's figure one position earlier (``default`` at the first). So a
        deep position seen a few times stays near its neighbour instead of jumping to 0 or 1. A position
        the session has not reached follows the prior's shape at the session's level where it was last
        observed (a session more predictable than the gateway's average is expected to stay so)."""
        key = (n, self._version, self.prior._version if self.prior is not None else -1)
        if self._memo is not None and self._memo[0] == key:
            return list(self._memo[1])
        prior = self.prior.model_acceptances(n) if self.prior is not None else None
        deepest = max((j for j in range(min(n, len(self._model))) if self._model[j].t > 0), default=-1)
        out: list[float] = []
        for i in range(n):
            if prior is None:
                est = self._own(i).estimate(out[i - 1] if i else self.default)
            elif i <= deepest or deepest < 0:
                est = self._own(i).estimate(prior[i])
            else:   # not reached yet: the prior's shape at this session's level, and never below the deepest
                    # observed position's (conditional acceptance tends to rise with depth): optimistic, so a
                    # longer block gets tried once and then measured
                est = max(prior[i] * out[deepest] / max(_A_MIN, prior[deepest]), out[deepest])
            out.append(min(_A_MAX, max(_A_MIN, est)))
        self._memo = (key, out)
        return list(out)

    def lookup_acceptance(self, ngram: int = 0) -> float:
        """Conditional acceptance of a lookup token; ``ngram`` > 0: of one found by a match of that length
        (its own evidence, shrunk toward the prior's figure for that length; without a prior, toward this
        estimator's figure over all lengths)."""
        b = _bucket(ngram)
        if b:
            prior = (self.prior.lookup_acceptance(b) if self.prior is not None
                     else self._lookup.estimate(self.default_lookup))
            return min(_A_MAX, max(_A_MIN, self._lookup_by_n[b].estimate(prior)))
        prior = self.prior.lookup_acceptance() if self.prior is not None else self.default_lookup
        return min(_A_MAX, max(_A_MIN, self._lookup.estimate(prior)))

    def match_acceptance(self, length: int) -> float:
        """Conditional acceptance of a copy found by a match of ``length`` tokens (> 0): its bucket's evidence,
        shrunk toward the prior's figure for the bucket (without a prior: toward ``default_lookup``)."""
        b = max(1, match_bucket(length))
        prior = self.prior.match_acceptance(length) if self.prior is not None else self.default_lookup
        return min(_A_MAX, max(_A_MIN, self._match[b].estimate(prior)))

    def lookup_yield(self) -> float:
        """The share of predicted lookup tokens the drafter sends as lookup copies (1 until observed:
        the gateway predicts with the drafter's own rule)."""
        prior = self.prior.lookup_yield() if self.prior is not None else 1.0
        return min(1.0, max(0.0, self._yield.estimate(prior)))

    def table(self, positions: int = 8) -> dict[str, float]:
        out = {f"a{i + 1}": round(a, 4) for i, a in enumerate(self.model_acceptances(positions))}
        out["a_lookup"] = round(self.lookup_acceptance(), 4)
        for n in range(1, NGRAM_BUCKETS + 1):
            out[f"a_lookup_n{n}"] = round(self.lookup_acceptance(n), 4)
        out["lookup_yield"] = round(self.lookup_yield(), 4)
        for b, edge in enumerate(MATCH_EDGES, 1):
            out[f"a_match{edge}"] = round(self.match_acceptance(edge), 4)
        return out
