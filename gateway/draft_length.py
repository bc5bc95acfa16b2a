"""Choosing the draft length k of every round from measured costs and acceptance (issue 15).

Speculation pays in tokens per millisecond, not in acceptance alone (DESIGN.md, "When speculation
pays"). Before each round the policy picks the k in 0..k_max that maximises

    E[tokens | k] / E[ms | k]
    E[tokens | k] = 1 + sum_{j=1..k} prod_{i<=j} a_i          (a_i: conditional acceptance of position i)
    E[ms | k]     = t_draft(k) + t_verify(k) + overhead(k)

where k = 0 is a plain decoding step: 1 token for one verify at width 0, no draft cost and no round
trip to the drafter. Maximising the ratio per round maximises long-run throughput (renewal-reward):
each round is one renewal cycle with reward = tokens and length = ms.

Pieces (all plain Python, no grpc/torch/numpy):

- ``CostModel`` (one per verifier + drafter pair): verify ms per block width w (w draft tokens, a
  forward over w+1 positions) as a decayed mean per observed width, seedable from the verifier's
  profile table; unobserved widths are read off a monotone (isotonic) fit of the observed ones,
  interpolated linearly and extrapolated with the last slope. Drafter ms per *model* token (tokens
  copied by prompt lookup cost next to nothing and are timed separately), and per context token it
  reads before drafting when a call finds it behind (a new session, or the tokens of a plain streak:
  ``catch_up_ms``; a block pays the share of it that its expected tokens are of what the request has
  left, since the drafter stays caught up for the rounds after); round overhead (network,
  serialization) for plain rounds and for speculative rounds, whose difference is the round trip
  to the drafter: on a slow link a speculative round carries a larger fixed cost, so longer blocks
  amortise it and the chosen k grows.
- ``AcceptanceEstimator``: per-position conditional acceptance a_i = P(token i accepted | tokens < i
  accepted), decayed (EWMA), censored correctly (a position after the first rejection is not
  observed). A session's estimator starts from a gateway-wide one (pseudo-observations that fade as
  the session's own rounds arrive), so its first rounds are sane. Tokens copied by prompt lookup have
  their own, separately learned acceptance, per length of the n-gram the match was found by (1, 2, 3,
  4+: a long match -- a quote, a name, a repeated line -- is usually right, a match on the last token
  alone often is not), and the estimator learns the *lookup yield*: the share of
  the lookup tokens the gateway predicted (it runs the drafter's lookup rule, from its GetInfo, over the
  sequence it holds) that the drafter really sent as lookup copies. Lookup checks (``--lookup-trust-ngram``)
  yield fewer, and a predicted match must not make a long block of the drafter's own, maybe useless,
  tokens look nearly free. A block the rule supplies whole and unchecked the gateway copies itself
  (``local_lookup``): it costs verify + the plain overhead, with no drafter call and no yield to learn.
- ``choose_k``: evaluates every candidate and returns a ``Decision`` with the whole table.
- ``DraftLengthPolicy`` (one per request): ``next_k(k_max)`` before a round, ``observe(figures)``
  after it. When k = 0 wins it keeps probing: a short block every N plain rounds, N doubling while
  probes lose (capped) and reset when one wins, so a session whose text turns predictable gets
  speculation back. An explicit k pins the policy (it still records the figures).

Exactness (DESIGN.md's rule; Leviathan et al. 2023, Chen et al. 2023). The k of a round is a function
of figures already observed — past rounds' acceptances, timings, the lookup tokens available in the
context — and never of the current block's target probabilities, which are unseen when k is fixed.
So every round is a standard speculative-sampling step with a k fixed before verification: given
everything that happened before it, the tokens it emits are distributed exactly as the target's
continuation of the prefix, whatever k is; by the tower property the whole output has the target's
distribution, unchanged by the adaptive choice. (The same argument covers a drafter that stops a
block early on its own confidence: that uses q, never p.) For greedy decoding any k yields the
target's argmax chain, so the output is token-for-token that of plain decoding.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["RoundFigures", "CostModel", "AcceptanceEstimator", "Candidate", "Decision", "choose_k",
           "expected_tokens", "DraftLengthPolicy"]


# ---------------------------------------------------------------------------------------------------
# What one round reports
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoundFigures:
    """The figures of one finished round that the cost model and the acceptance estimator learn from.

    Independent of ``gateway.rounds.Round``'s layout: build it from the Proposal, the VerifyOutcome and
    the round's wall time (``from_outcome``).
    """

    width: int                          # draft tokens verified (the forward covered width + 1 positions)
    accepted: int                       # draft tokens kept (a prefix of the block)
    verify_ms: float                    # verifier's own compute (VerifyOutcome.compute_ms)
    round_ms: float                     # wall time of the round at the gateway
    draft_ms: float = 0.0               # drafter's own compute (Proposal.compute_ms)
    from_lookup: tuple[bool, ...] = ()  # per proposed token: copied by prompt lookup; () = none were
    drafter_called: bool | None = None  # a Propose call happened (None: width > 0)
    propose_wall_ms: float | None = None  # wall time of the Propose call at the gateway, if timed
    lookup_predicted: int = 0           # lookup tokens the gateway predicted at the block's head (its choice of k)
    lookup_ngram: int = 0               # the n-gram length that prediction was found by (0: none / unknown)
    catch_up: int = 0                   # context tokens the drafter had not seen before this call (read first)

    def __post_init__(self):
        if self.from_lookup and len(self.from_lookup) != self.width:
            raise ValueError(f"from_lookup has {len(self.from_lookup)} flags for a block of {self.width}")
        if not 0 <= self.accepted <= self.width:
            raise ValueError(f"accepted {self.accepted} outside 0..{self.width}")

    @property
    def speculative(self) -> bool:
        return self.width > 0 if self.drafter_called is None else bool(self.drafter_called)

    @property
    def lookup_tokens(self) -> int:
        return sum(self.from_lookup)

    @property
    def model_tokens(self) -> int:
        return self.width - self.lookup_tokens

    def is_lookup(self, i: int) -> bool:
        return bool(self.from_lookup) and self.from_lookup[i]

    @classmethod
    def from_outcome(cls, proposal, outcome, round_ms: float, propose_wall_ms: float | None = None,
                     drafter_called: bool | None = None) -> "RoundFigures":
        """From a ``tandem.types.Proposal`` and ``VerifyOutcome`` (duck-typed). The lookup prediction
        (``lookup_predicted``, ``lookup_ngram``) is the policy's: ``DraftLengthPolicy.observe`` adds it."""
        tokens = tuple(proposal.tokens)
        return cls(width=len(tokens), accepted=int(outcome.accepted), verify_ms=float(outcome.compute_ms),
                   round_ms=float(round_ms), draft_ms=float(proposal.compute_ms),
                   from_lookup=tuple(bool(getattr(t, "from_lookup", False)) for t in tokens),
                   drafter_called=drafter_called, propose_wall_ms=propose_wall_ms)


# ---------------------------------------------------------------------------------------------------
# Decayed means
# ---------------------------------------------------------------------------------------------------
@dataclass
class _Ewma:
    """A bias-corrected exponentially weighted mean: the first observations average, later ones decay
    with weight ``alpha``. A seed counts as ``seed_weight`` observations."""

    alpha: float
    mean: float = 0.0
    n: float = 0.0          # observations so far (seed included), capped growth is irrelevant

    def add(self, x: float) -> None:
        self.n += 1.0
        w = max(self.alpha, 1.0 / self.n)
        self.mean += w * (x - self.mean)

    def seed(self, x: float, weight: float = 1.0) -> None:
        self.mean, self.n = float(x), float(weight)

    @property
    def known(self) -> bool:
        return self.n > 0


def _isotonic(points: Sequence[tuple[int, float, float]]) -> list[tuple[int, float]]:
    """Pool-adjacent-violators: the weighted least-squares non-decreasing fit of (x, y, weight) sorted by x."""
    if all(a[1] <= b[1] for a, b in zip(points, points[1:])):
        return [(x, y) for x, y, _ in points]   # already monotone (the usual case): the fit is the points
    blocks: list[list[float]] = []          # [sum w*y, sum w, first index, last index]
    xs = [p[0] for p in points]
    for i, (_, y, w) in enumerate(points):
        blocks.append([w * y, w, i, i])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            top = blocks.pop()
            blocks[-1][0] += top[0]
            blocks[-1][1] += top[1]
            blocks[-1][3] = top[3]
    out: list[tuple[int, float]] = []
    for swy, sw, lo, hi in blocks:
        for i in range(lo, hi + 1):
            out.append((xs[i], swy / sw))
    return out


# ---------------------------------------------------------------------------------------------------
# Costs
# ---------------------------------------------------------------------------------------------------
CATCH_UP_FREE = 16      # context tokens a drafter call reads at no extra cost (those a drafting round brings)


class CostModel:
    """Measured costs of one verifier + drafter pair, learned online with decayed means.

    - verify ms per width w (draft tokens in the block): one decayed mean per observed width, seeded
      from the verifier's profile table; other widths from a monotone fit (``verify_ms``).
    - drafter ms per model-drafted token; ms per lookup token (nearly free) apart.
    - overhead ms of a plain round (gateway <-> verifier) and of a speculative round (that plus the
      round trip to the drafter): ``round_ms - draft_ms - verify_ms``. When the round loop times the
      Propose call (``propose_wall_ms``), a speculative round also measures the plain part exactly.

    Unobserved figures default to 0 (optimism under uncertainty): a wrong guess is tried once,
    measured, and corrected, whereas a pessimistic guess would never be revisited.
    """

    def __init__(self, alpha: float = 0.15, default_slope: float = 0.25):
        """``alpha``: weight of a new observation. ``default_slope``: with a single width measured,
        verify ms is extrapolated as v(w) = v0 * (1 + default_slope * w)."""
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = float(alpha)
        self.default_slope = float(default_slope)
        self._verify: dict[int, _Ewma] = {}
        self._draft_per_token = _Ewma(alpha)
        self._lookup_per_token = _Ewma(alpha)
        self._catch_up_per_token = _Ewma(alpha)
        self._plain_overhead = _Ewma(alpha)
        self._spec_overhead = _Ewma(alpha)
        self._pinged_round_trip = 0.0          # a ping of the drafter (GetInfo), until Propose calls are measured
        self._fit: list[tuple[int, float]] | None = None
        self._curve: list[float] = []          # verify_ms per width 0.., read off the current fit
        self.rounds_observed = 0

    # ---- learning ---------------------------------------------------------------------------------
    def seed(self, table: Mapping[int, float], weight: float = 1.0) -> None:
        """Seeds verify ms per width from a profile table {width: ms} (the verifier's GetInfo, or a short
        profile at first use). A seed counts as ``weight`` observations: measurements take over."""
        for w, ms in table.items():
            if int(w) < 0 or not math.isfinite(float(ms)) or float(ms) < 0:
                raise ValueError(f"bad profile entry {w}: {ms}")
            self._verify.setdefault(int(w), _Ewma(self.alpha)).seed(float(ms), weight)
        self._fit = None

    def seed_draft(self, per_token_ms: float, weight: float = 1.0) -> None:
        self._draft_per_token.seed(per_token_ms, weight)

    def seed_overhead(self, plain_ms: float, speculative_ms: float | None = None, weight: float = 1.0) -> None:
        """Seeds the overheads; ``speculative_ms`` defaults to ``plain_ms`` (drafter next door)."""
        self._plain_overhead.seed(plain_ms, weight)
        self._spec_overhead.seed(plain_ms if speculative_ms is None else speculative_ms, weight)

    def seed_drafter_round_trip(self, ms: float) -> None:
        """The round trip to the drafter as a ping measured it (the gateway times GetInfo at first use): until
        rounds that call the drafter are measured, a speculative round's overhead is the plain one plus this.
        Without it the first probes behind a slow link were chosen as if the drafter were next door."""
        if not math.isfinite(float(ms)) or float(ms) < 0:
            raise ValueError(f"bad drafter round trip: {ms}")
        self._pinged_round_trip = float(ms)

    def observe(self, fig: RoundFigures) -> None:
        """Learns from one round (not the prefill)."""
        self.rounds_observed += 1
        self._verify.setdefault(fig.width, _Ewma(self.alpha)).add(max(0.0, fig.verify_ms))
        self._fit = None
        if fig.speculative:
            model, lookup = fig.model_tokens, fig.lookup_tokens
            if model > 0:
                lookup_ms = lookup * self._lookup_per_token.mean if self._lookup_per_token.known else 0.0
                model_ms = max(0.0, fig.draft_ms - lookup_ms)
                if fig.catch_up <= CATCH_UP_FREE:
                    self._draft_per_token.add(model_ms / model)
                else:   # a call after plain rounds (a probe) or on a new session: the drafter read the context first
                    self._catch_up_per_token.add(max(0.0, model_ms - model * self._draft_per_token.mean) / fig.catch_up)
            elif lookup > 0:
                self._lookup_per_token.add(max(0.0, fig.draft_ms) / lookup)
            overhead = max(0.0, fig.round_ms - fig.draft_ms - fig.verify_ms)
            self._spec_overhead.add(overhead)
            if fig.propose_wall_ms is not None:     # the plain part, measured apart from the drafter's link
                self._plain_overhead.add(max(0.0, fig.round_ms - fig.propose_wall_ms - fig.verify_ms))
        else:
            self._plain_overhead.add(max(0.0, fig.round_ms - fig.verify_ms))

    # ---- reading ----------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Whether any verify cost is known (seeded or measured): without one no choice is meaningful."""
        return any(e.known for e in self._verify.values())

    def _points(self) -> list[tuple[int, float]]:
        if self._fit is None:
            pts = sorted((w, e.mean, e.n) for w, e in self._verify.items() if e.known)
            self._fit = _isotonic(pts) if pts else []
            self._curve = []
        return self._fit

    def verify_ms(self, width: int) -> float:
        """Verify ms of a block of ``width`` draft tokens: non-decreasing in width."""
        if width < 0:
            return self._read(range(width, width + 1))[0]
        return self.verify_curve(width)[width]

    def verify_curve(self, top: int) -> list[float]:
        """``verify_ms(w)`` for w = 0..top, read off the current fit once (cached until the next observation:
        the choice reads every width each round)."""
        self._points()
        if len(self._curve) <= top:
            self._curve.extend(self._read(range(len(self._curve), top + 1)))
        return self._curve

    def _read(self, widths: range) -> list[float]:
        """The fit read at increasing ``widths``: linear between measured widths; outside them, the
        least-squares slope of the monotone fit (robust to one noisy end point, which a two-point slope
        would amplify over many widths); with one width measured, ``default_slope``."""
        pts = self._points()
        if not pts:
            return [0.0] * len(widths)
        if len(pts) == 1:
            (w0, v), = pts
            base = v / (1.0 + self.default_slope * w0)
            return [base * (1.0 + self.default_slope * w) for w in widths]
        (x_first, y_first), (x_last, y_last) = pts[0], pts[-1]
        slope, j, out = None, 0, []
        for w in widths:
            if x_first <= w <= x_last:
                while pts[j + 1][0] < w:
                    j += 1
                (xa, ya), (xb, yb) = pts[j], pts[j + 1]
                out.append(ya + (yb - ya) * (w - xa) / (xb - xa))
                continue
            if slope is None:
                mx = sum(x for x, _ in pts) / len(pts)
                my = sum(y for _, y in pts) / len(pts)
                slope = max(0.0, sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts))
            out.append(y_last + slope * (w - x_last) if w > x_last else max(0.0, y_first - slope * (x_first - w)))
        return out

    @property
    def draft_ms_per_token(self) -> float:
        return self._draft_per_token.mean

    @property
    def lookup_ms_per_token(self) -> float:
        return self._lookup_per_token.mean

    def catch_up_ms(self, tokens: int) -> float:
        """What the drafter spends reading ``tokens`` of context it has not seen (a session new to it, or
        the tokens of a plain streak) before it drafts: 0 up to ``CATCH_UP_FREE`` (a drafting round's own
        few, in ``draft_ms_per_token``), measured per token beyond."""
        return self._catch_up_per_token.mean * tokens if tokens > CATCH_UP_FREE else 0.0

    @property
    def plain_overhead_ms(self) -> float:
        return self._plain_overhead.mean

    @property
    def speculative_overhead_ms(self) -> float:
        """Overhead of a speculative round; at least the plain one (it adds the drafter's round trip)."""
        if not self._spec_overhead.known:
            return self._plain_overhead.mean + self._pinged_round_trip
        return max(self._spec_overhead.mean, self._plain_overhead.mean)

    @property
    def drafter_round_trip_ms(self) -> float:
        return self.speculative_overhead_ms - self.plain_overhead_ms

    def expected_ms(self, k: int, lookup_tokens: int = 0) -> float:
        """Expected wall ms of a round with a block of k (the first ``lookup_tokens`` copied by lookup)."""
        k = max(0, k)
        return self.round_ms(k, lookup_tokens)[k]

    def round_ms(self, top: int, lookup_tokens: int = 0) -> list[float]:
        """``expected_ms(k, lookup_tokens)`` for k = 0..top in one pass (the choice reads every k each round).
        k = 0 is a plain step: verify at width 0 and the plain overhead, no draft and no drafter trip."""
        verify = self.verify_curve(top)
        spec = self.speculative_overhead_ms
        per_model, per_lookup = self._draft_per_token.mean, self._lookup_per_token.mean
        lookup = max(0, lookup_tokens)
        out = [verify[0] + self._plain_overhead.mean]
        for k in range(1, top + 1):             # draft: k - n model tokens and n lookup copies
            n = lookup if lookup < k else k
            out.append((k - n) * per_model + n * per_lookup + verify[k] + spec)
        return out

    def local_lookup_ms(self, k: int) -> float:
        """Expected wall ms of a round whose block of k the gateway copies by prompt lookup itself: no
        drafter call, so no draft time and no round trip to the drafter."""
        return self.local_lookup_curve(k)[k]

    def local_lookup_curve(self, top: int) -> list[float]:
        """``local_lookup_ms(k)`` for k = 0..top in one pass."""
        plain = self._plain_overhead.mean
        return [v + plain for v in self.verify_curve(top)[:top + 1]]

    def table(self, max_width: int = 8) -> dict[str, float]:
        """Plain figures for display and Prometheus gauges."""
        out = {f"verify_ms_w{w}": round(self.verify_ms(w), 4) for w in range(max_width + 1)}
        out.update(draft_ms_per_token=round(self.draft_ms_per_token, 4),
                   lookup_ms_per_token=round(self.lookup_ms_per_token, 4),
                   catch_up_ms_per_token=round(self._catch_up_per_token.mean, 4),
                   plain_overhead_ms=round(self.plain_overhead_ms, 4),
                   speculative_overhead_ms=round(self.speculative_overhead_ms, 4),
                   drafter_round_trip_ms=round(self.drafter_round_trip_ms, 4),
                   drafter_ping_ms=round(self._pinged_round_trip, 4),
                   rounds_observed=float(self.rounds_observed))
        return out


# ---------------------------------------------------------------------------------------------------
# Acceptance
# ---------------------------------------------------------------------------------------------------
_A_MIN, _A_MAX = 1e-3, 0.995
NGRAM_BUCKETS = 4               # lookup acceptance per match length 1, 2, 3 and 4+


def _bucket(ngram: int) -> int:
    return min(max(0, int(ngram)), NGRAM_BUCKETS)


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
    """Conditional acceptance per block position, a_i = P(draft i accepted | drafts < i accepted), decayed.

    Model-drafted tokens are indexed by their position among the block's model tokens (a lookup prefix
    does not count: after it the drafter starts afresh from accepted context); tokens copied by prompt
    lookup share one separately learned conditional acceptance.

    A session's estimator starts from its ``prior`` (the gateway-wide estimator; without one, the
    constants ``default`` / ``default_lookup``) as ``prior_weight`` pseudo-observations per position
    that decay like real ones, so its own rounds take over within a few rounds and one early rejection
    does not drive an estimate to 0. Positions not reached yet follow the prior's shape scaled to the
    level at the deepest observed position (without a prior: that level carried forward).
    ``observe`` also feeds the prior when ``share`` is set.
    """

    def __init__(self, alpha: float = 0.1, prior: "AcceptanceEstimator | None" = None, prior_weight: float = 3.0,
                 default: float = 0.6, default_lookup: float = 0.8, share: bool = True):
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha, self.prior, self.prior_weight = float(alpha), prior, float(prior_weight)
        self.default, self.default_lookup, self.share = float(default), float(default_lookup), share
        self._model: list[_Slot] = []   # per model position
        self._lookup = _Slot(self.prior_weight)          # every lookup token
        self._lookup_by_n = {n: _Slot(self.prior_weight) for n in range(1, NGRAM_BUCKETS + 1)}   # per match length
        self._yield = _Slot(self.prior_weight)   # share of predicted lookup tokens that arrived as lookup copies
        self._version = 0                        # bumped by every change: model_acceptances is memoised on it
        self._memo: tuple | None = None

    # ---- learning ---------------------------------------------------------------------------------
    def _slot(self, i: int) -> "_Slot":
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
        drift back toward the gateway-wide figures instead of freezing at their last, unlucky value."""
        self._version += 1
        for slot in (*self._model, self._lookup, *self._lookup_by_n.values(), self._yield):
            if slot.n:                  # a slot with no evidence of its own has none to move
                slot.relax(beta)

    def observe_block(self, from_lookup: Sequence[bool], accepted: int, ngram: int = 0) -> None:
        """One verified block: flags per proposed token and the number accepted. Positions after the
        first rejection are not observed (the conditional is only defined given the prefix accepted).
        ``ngram``: the length of the n-gram the gateway's lookup prediction was found by (0: unknown)."""
        model_index = 0
        for i, lookup in enumerate(from_lookup):
            if i > accepted:
                break
            if lookup:
                self._add_lookup(i < accepted, ngram)
            else:
                self._add(model_index, i < accepted)
                model_index += 1
        if self.share and self.prior is not None:
            self.prior.observe_block(from_lookup, accepted, ngram)

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
            self.observe_block(fig.from_lookup or (False,) * fig.width, fig.accepted, fig.lookup_ngram)
            if fig.lookup_predicted:
                self.observe_lookup_yield(min(fig.lookup_predicted, fig.width), fig.from_lookup)

    # ---- reading ----------------------------------------------------------------------------------
    def _own(self, i: int) -> "_Slot":
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

    def model_acceptance(self, i: int) -> float:
        """a_{i+1}: the i-th (0-based) model-drafted token of a block."""
        return self.model_acceptances(i + 1)[i]

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

    def lookup_yield(self) -> float:
        """The share of predicted lookup tokens the drafter sends as lookup copies (1 until observed:
        the gateway predicts with the drafter's own rule)."""
        prior = self.prior.lookup_yield() if self.prior is not None else 1.0
        return min(1.0, max(0.0, self._yield.estimate(prior)))

    def acceptances(self, k: int, lookup_tokens: int = 0, ngram: int = 0) -> list[float]:
        """a_1..a_k of a block whose first ``lookup_tokens`` tokens are copied by lookup (found by an
        ``ngram``-token match)."""
        lookup = min(max(0, lookup_tokens), k)
        return [self.lookup_acceptance(ngram)] * lookup + self.model_acceptances(k - lookup)

    def table(self, positions: int = 8) -> dict[str, float]:
        out = {f"a{i + 1}": round(a, 4) for i, a in enumerate(self.model_acceptances(positions))}
        out["a_lookup"] = round(self.lookup_acceptance(), 4)
        for n in range(1, NGRAM_BUCKETS + 1):
            out[f"a_lookup_n{n}"] = round(self.lookup_acceptance(n), 4)
        out["lookup_yield"] = round(self.lookup_yield(), 4)
        return out


def expected_tokens(acceptances: Sequence[float]) -> float:
    """E[tokens emitted by a round] = 1 + sum_j prod_{i<=j} a_i (the recovered/bonus token included)."""
    return _expected_prefixes(acceptances)[-1]


def _expected_prefixes(acceptances: Sequence[float]) -> list[float]:
    """[expected_tokens(acceptances[:j]) for j in 0..len(acceptances)] in one pass."""
    out, total, run = [1.0], 1.0, 1.0
    for a in acceptances:
        run *= a
        total += run
        out.append(total)
    return out


# ---------------------------------------------------------------------------------------------------
# The choice
# ---------------------------------------------------------------------------------------------------
class Candidate(NamedTuple):
    """One k the choice weighed (a tuple: nine of them are built every round)."""

    k: int
    expected_tokens: float
    expected_ms: float
    tokens_per_ms: float


@dataclass(frozen=True)
class Decision:
    k: int
    expected_tokens: float
    expected_ms: float
    tokens_per_ms: float
    candidates: tuple[Candidate, ...] = ()
    reason: str = "best"            # best | probe | pinned | no-figures | no-budget

    def table(self) -> dict[int, float]:
        """{k: expected tokens per ms} of every candidate."""
        return {c.k: c.tokens_per_ms for c in self.candidates}


def _candidates(cost: CostModel, acceptance: AcceptanceEstimator, ks: Sequence[int],
                lookup_available: int, lookup_ngram: int = 0, local_lookup: bool = False,
                catch_up_ms: float = 0.0, remaining: int = 0) -> tuple[Candidate, ...]:
    lookup = max(0, int(lookup_available))
    top = max(ks, default=0)
    # model[:k] and lookup[:n] + model[:k - n] blocks' expected tokens, from running products (O(k_max) a round)
    model = _expected_prefixes(acceptance.model_acceptances(top))
    a_lookup = acceptance.lookup_acceptance(lookup_ngram) if lookup else 0.0
    copies = _expected_prefixes([a_lookup] * min(lookup, top))
    # the predicted lookup tokens arrive with the learned yield y; otherwise the drafter drafts the block itself
    y = acceptance.lookup_yield() if lookup else 0.0
    drafted = cost.round_ms(top)
    with_copies = cost.round_ms(top, lookup) if lookup and y > 0 else drafted
    copied_ms = cost.local_lookup_curve(top) if local_lookup and lookup else None
    out = []
    for k in ks:
        n_lookup = min(lookup, k)
        tokens, ms = model[k], drafted[k]
        if local_lookup and 0 < k <= lookup:        # the gateway copies the block itself (gateway.rounds)
            tokens, ms = copies[k], copied_ms[k]
        else:
            if n_lookup and y > 0:
                # E[copies then model tokens] = E[copies] + P(all n copies accepted) * (E[model tokens] - 1)
                tokens = y * (copies[n_lookup] + a_lookup ** n_lookup * (model[k - n_lookup] - 1.0)) + (1 - y) * tokens
                ms = y * with_copies[k] + (1 - y) * ms
            if k and catch_up_ms:
                # the drafter reads what it has not seen first; that serves every later round it drafts, so
                # this round pays its share of the rest of the request (all of it when the rest is unknown)
                ms += catch_up_ms * (min(1.0, tokens / remaining) if remaining > 0 else 1.0)
        ms = max(1e-9, ms)
        out.append(Candidate(k, tokens, ms, tokens / ms))
    return tuple(out)


def choose_k(cost: CostModel, acceptance: AcceptanceEstimator, k_max: int, lookup_available: int = 0,
             lookup_ngram: int = 0, local_lookup: bool = False, catch_up_ms: float = 0.0,
             remaining: int = 0) -> Decision:
    """The k in 0..k_max with the most expected tokens per ms (ties: the smaller k).

    ``lookup_available``: how many tokens prompt lookup is expected to supply at the head of the block
    (the gateway can run the same lookup over the sequence it holds); they count with the lookup
    acceptance and the lookup cost; ``lookup_ngram``: the length of the n-gram they were found by (their
    acceptance is learned per length). ``local_lookup``: a block of k <= lookup_available is copied by
    the gateway itself (no drafter call: ``CostModel.local_lookup_ms``), with certainty. ``catch_up_ms``: what a
    drafter call this round spends first on context it has not seen (``CostModel.catch_up_ms``); a block
    expected to bring t of the request's ``remaining`` tokens is charged t / remaining of it."""
    k_max = max(0, int(k_max))
    cands = _candidates(cost, acceptance, range(k_max + 1), lookup_available, lookup_ngram, local_lookup,
                        catch_up_ms, remaining)
    best = cands[0]
    for c in cands[1:]:
        if c.tokens_per_ms > best.tokens_per_ms * (1.0 + 1e-9):
            best = c
    return Decision(best.k, best.expected_tokens, best.expected_ms, best.tokens_per_ms, cands,
                    "best" if k_max > 0 else "no-budget")


# ---------------------------------------------------------------------------------------------------
# Per request
# ---------------------------------------------------------------------------------------------------
@dataclass
class DraftLengthPolicy:
    """The draft length of each round of one request.

    ``next_k(k_max)`` before a round (k_max: the most the round may draft, already cut to the token
    budget and the context), ``observe(figures)`` after it. ``pinned``: an explicit k, always returned
    (cut to k_max); the figures are still recorded so the gateway-wide estimates stay current.

    Probing: while k = 0 wins, every ``interval`` plain rounds one round drafts a probe block: the k in
    1..probe_k_max that would bring the most tokens per ms if the text had turned predictable (its
    model tokens accepted at ``probe_acceptance``, or the estimates where higher), since that is what a
    probe asks: 1 or 2 where verify grows steeply with width, longer on a slow link, where a short block
    cannot pay for the trip however good the drafter gets (by the current, losing estimates k = 1 was
    always the most promising, behind a 10 ms round trip too).
    A probe wins when the probes' realized tokens/ms (decayed by ``probe_decay``, so one lucky block
    does not count as a trend) beats the expected plain tokens/ms: a win resets the interval to
    ``probe_every`` (as does a block the choice itself picked that beats a plain step; one that loses,
    e.g. on a lookup match that was wrong, leaves the schedule alone), a loss doubles it up to
    ``probe_cap`` -- and never beyond what the probe costs:
    a probe that is refused whole costs its extra milliseconds over a plain step (measured: round_ms /
    the plain round's - 1), so the interval stays at most that extra / ``probe_budget``, keeping the
    worst-case loss to probing near ``probe_budget`` of plain throughput. The budget holds from the
    first probe, not only once the doubling reaches that bound: after a loss the interval is at least
    what keeps the refused probes' extra cost since the last reset within ``probe_budget`` of the rounds
    since then (a fresh gateway whose probes cost 2x a plain step goes from every 4th round straight to
    about every 100th; the doubling from 4 spent 2.8 % in the first 230 rounds of `writing` on the
    2-core AMD EPYC, the category's largest loss to plain after the gateway's own work).

    Plain streaks: the estimates move by at most ``relax`` (toward the prior) a plain round, so a plain
    choice that beat every block by a margin m stands for about m / relax rounds; the policy reuses it
    for up to ``plain_hold_max`` rounds without weighing the candidates again, for the same room to draft
    and lookup match (writing finds a short match most rounds), until a block is observed or a probe is
    due. Weighing took 0.13 ms a round in the gateway on the 2-core AMD EPYC (the caches are cold after
    each verify), a reused choice 0.025 ms.

    Where verifying a short
    block costs about a plain step (oneDNN's flat curve) probes stay frequent and a session whose
    acceptance is bursty (writing) keeps its estimates fresh; where it costs much more (MKL's 2x at
    width 3) they back off to ``probe_cap``. The estimates the probes update decide when speculation
    comes back (choose_k picking k > 0 again). With ``shared`` (the gateway's, per sampling mode) the
    schedule (the interval, and the rounds since the drafter last drafted) carries over between requests, so
    requests shorter than the interval still get probed; short requests each restarting at ``probe_every`` spent 6 %
    of their rounds on probes with a useless drafter on the AMD EPYC (0.92x plain), far over the budget.
    """

    cost: CostModel
    acceptance: AcceptanceEstimator
    pinned: int | None = None
    k_cap: int = 16                     # auto never drafts more than this
    fallback_k: int = 2                 # used while no verify cost is known at all
    probe_every: int = 4
    probe_cap: int = 256                # the budget (below) sets the interval up to this; a probe that pays a
                                        # cold drafter session (the whole context to catch up on) costs 2-4x a plain step
    probe_k_max: int = 8                # (4 capped the probe behind a slow link at what loopback probed)
    probe_acceptance: float = 0.8       # the acceptance a probe's length is chosen for (predictable text:
                                        # quoted passages, code copied from the prompt)
    probe_budget: float = 0.005         # worst-case share of plain throughput spent on refused probes (at 2 %
                                        # and 1 % they were half of writing's loss to plain on the 2-core AMD EPYC)
    relax: float = 0.02                 # per plain round: stale session evidence drifts back to the prior
    interval: int = field(init=False)
    plain_streak: int = field(init=False, default=0)
    probes: int = field(init=False, default=0)
    last: Decision | None = field(init=False, default=None)
    probe_decay: float = 0.5            # weight of earlier probes in the probes' realized tokens/ms
    _probe_plain_rate: float | None = field(init=False, default=None)
    _spec_plain_rate: float | None = field(init=False, default=None)   # a chosen (not probe) block in flight
    _probe_cap_now: int = field(init=False, default=0)    # the interval's cost bound for the probe in flight
    _probe_tokens: float = field(init=False, default=0.0)
    _probe_ms: float = field(init=False, default=0.0)
    shared: dict | None = None          # gateway-wide probe state ({"interval": n}): a new session starts where
                                        # the last ones left the schedule, not at probe_every again
    lookup_predicted: int = field(init=False, default=0)  # the last next_k's lookup_available
    lookup_ngram: int = field(init=False, default=0)      # and the n-gram length it was found by
    behind: int = field(init=False, default=0)            # the last next_k's context tokens unseen by the drafter
    plain_hold_max: int = 8             # plain rounds a clear plain choice is reused for (0: weigh every round)
    _held: dict = field(init=False, default_factory=dict)  # (k_max, lookup, n-gram, local) -> (plain Decision,
    _rounds: int = field(init=False, default=0)              # the round it expires at, its catch-up ms)

    def __post_init__(self):
        # the probe schedule: its interval, the rounds since the drafter last drafted, and since the last
        # reset the rounds and the refused probes' extra cost (in plain rounds); gateway-wide with ``shared``
        self._schedule = self.shared if self.shared is not None else {}
        start = self._schedule.get("interval", self.probe_every)
        self.interval = max(self.probe_every, min(int(start), self.probe_cap))

    def _set_interval(self, interval: int) -> None:
        self.interval = interval
        self._schedule["interval"] = interval

    def _reset_schedule(self) -> None:
        self._set_interval(self.probe_every)
        self._schedule["rounds"] = self._schedule["spent"] = 0
        self._probe_tokens = self._probe_ms = 0.0

    def _hold_for(self, d: Decision) -> int:
        """Rounds a plain choice can be reused for: each plain round moves the estimates by at most
        ``relax``, so a choice that beat the best block by a share m cannot flip for about m / relax rounds."""
        if d.k != 0 or len(d.candidates) < 2 or not self.plain_hold_max:
            return 0
        plain = d.candidates[0].tokens_per_ms
        rival = max(c.tokens_per_ms for c in d.candidates[1:])
        margin = 1.0 - rival / plain if plain > 0 else 0.0
        return max(0, min(self.plain_hold_max, int(margin / max(self.relax, 0.01))))

    def next_k(self, k_max: int, lookup_available: int = 0, lookup_ngram: int = 0,
               local_lookup: bool = False, behind: int = 0, remaining: int = 0) -> Decision:
        """``lookup_available`` tokens prompt lookup copies at the block's head this round (found by an
        ``lookup_ngram``-token match); ``local_lookup``: a block of at most that many is copied by the
        gateway itself (gateway.rounds), without a drafter call. ``behind``: context tokens the drafter has
        not seen (it reads them before drafting); ``remaining``: tokens the request may still emit."""
        k_max = max(0, int(k_max))
        self.behind = max(0, int(behind))
        catch_up = self.cost.catch_up_ms(self.behind)
        self._probe_plain_rate = self._spec_plain_rate = None
        self.lookup_predicted = max(0, int(lookup_available))
        self.lookup_ngram = max(0, int(lookup_ngram)) if self.lookup_predicted else 0
        if self.pinned is not None:
            k = min(self.pinned, k_max)
            c, = _candidates(self.cost, self.acceptance, (k,), lookup_available, self.lookup_ngram, local_lookup,
                             catch_up, remaining)
            d = Decision(k, c.expected_tokens, c.expected_ms, c.tokens_per_ms, (c,), "pinned")
        elif not self.cost.ready and k_max > 0:
            k = min(self.fallback_k, k_max)
            d = Decision(k, float("nan"), float("nan"), float("nan"), (), "no-figures")
        else:
            # rounds since the drafter last drafted count gateway-wide, so requests shorter than the
            # interval still get probes
            self.plain_streak = self._schedule.get("streak", self.plain_streak)
            last = self.last
            # a clear plain choice stands (the class docstring) for the same room to draft and lookup match,
            # while no block has been observed since and there is no less to catch up on
            key = (k_max, self.lookup_predicted, self.lookup_ngram, local_lookup)
            held = self._held.get(key) if self.plain_streak + 1 < self.interval else None
            if held is not None and held[1] > self._rounds and catch_up >= held[2]:
                d = held[0]
            else:
                d = choose_k(self.cost, self.acceptance, min(k_max, self.k_cap), lookup_available,
                             self.lookup_ngram, local_lookup, catch_up, remaining)
                hold = self._hold_for(d)
                if hold:
                    self._held[key] = (d, self._rounds + 1 + hold, catch_up)
            self._rounds += 1
            # blocks the gateway copies itself (local lookup) are not the drafter's: they neither probe it
            # nor, when they win, say that it pays
            copied = lookup_available if local_lookup else 0
            if k_max == 0:
                pass                            # no room to draft (a request's last round): no evidence
            elif 0 < d.k <= copied:
                self.plain_streak += 1          # the drafter's probe schedule goes on
            elif d.k > 0:
                self.plain_streak = 0
                if d.candidates:
                    # the probe schedule resets only if this round wins against a plain step (observe):
                    # a session that speculates now and then on a lookup match is not a winning one
                    self._spec_plain_rate = d.candidates[0].tokens_per_ms
            else:
                self.plain_streak += 1
                eligible = [c for c in d.candidates[1:min(self.probe_k_max, k_max) + 1] if c.k > copied]
                if self.plain_streak >= self.interval and eligible:      # else: the next round probes
                    self.plain_streak = 0
                    hoped = _expected_prefixes([max(a, self.probe_acceptance) for a in
                                                self.acceptance.model_acceptances(eligible[-1].k)])
                    probe = max(eligible, key=lambda c: hoped[c.k] / c.expected_ms)
                    self._probe_plain_rate = d.candidates[0].tokens_per_ms
                    extra = probe.expected_ms / d.candidates[0].expected_ms - 1.0
                    self._probe_cap_now = (max(1, math.ceil(extra / self.probe_budget)) if math.isfinite(extra)
                                           and self.probe_budget > 0 else self.probe_cap)
                    self.probes += 1
                    d = Decision(probe.k, probe.expected_tokens, probe.expected_ms, probe.tokens_per_ms,
                                 d.candidates, "probe")
            if k_max:
                self._schedule["rounds"] = self._schedule.get("rounds", 0) + 1
            self._schedule["streak"] = self.plain_streak
        self.last = d
        return d

    def observe(self, fig: RoundFigures) -> None:
        extra = {}                          # what this policy knows of the round that the figures lack
        if fig.width and self.lookup_predicted:
            if not fig.lookup_ngram:        # the copies' acceptance is learned per match length, copied here or not
                extra["lookup_ngram"] = self.lookup_ngram
            # the lookup yield is the drafter's: a block the gateway copied itself says nothing about it
            if fig.speculative and not fig.lookup_predicted:
                extra["lookup_predicted"] = self.lookup_predicted
        if fig.speculative and fig.width and self.behind and not fig.catch_up:
            extra["catch_up"] = self.behind
        if extra:
            fig = dataclasses.replace(fig, **extra)
        self.cost.observe(fig)
        self.acceptance.observe(fig)
        if fig.width:
            self._held.clear()              # a block's evidence can move the estimates by more than relax
        elif self.relax:
            self.acceptance.relax(self.relax)
        if self._spec_plain_rate is not None:
            if (fig.accepted + 1) / max(1e-9, fig.round_ms) >= self._spec_plain_rate:
                self._reset_schedule()
            self._spec_plain_rate = None
        if self._probe_plain_rate is not None:
            self._probe_tokens = self.probe_decay * self._probe_tokens + fig.accepted + 1
            self._probe_ms = self.probe_decay * self._probe_ms + max(1e-9, fig.round_ms)
            if self._probe_tokens / self._probe_ms >= self._probe_plain_rate:
                self._reset_schedule()
            else:
                # the budget bounds what a refused probe costs as measured, not as predicted: a probe after
                # a plain streak also pays the drafter's catch-up on the tokens it missed (writing, 2-core
                # AMD EPYC: 10.1 ms measured against ~7 predicted, a 5.7 ms plain round)
                extra = max(0.0, max(1e-9, fig.round_ms) * self._probe_plain_rate - 1.0)
                interval = self.interval * 2
                if self.probe_budget > 0:
                    self._probe_cap_now = max(self._probe_cap_now, math.ceil(extra / self.probe_budget))
                    # and from the first probe on: the refused probes since the last reset stay within the
                    # budget of the rounds since then
                    spent = self._schedule.get("spent", 0.0) + extra
                    self._schedule["spent"] = spent
                    interval = max(interval, math.ceil(spent / self.probe_budget - self._schedule.get("rounds", 0)))
                self._set_interval(max(1, min(interval, self.probe_cap, self._probe_cap_now)))
            self._probe_plain_rate = None
