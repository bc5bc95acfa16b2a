"""The cost model: the expected wall time of a round, per draft length, on one verifier + drafter pair.

A round whose block has k draft tokens, the first n of them copied by prompt lookup, costs

    E[ms | k] = t_draft(k, n) + t_verify(k) + overhead_speculative          (k > 0: the drafter is called)
    E[ms | 0] = t_verify(0) + overhead_plain                                (a plain decoding step)

and a block the gateway copies itself by prompt lookup (no drafter call) t_verify(k) + overhead_plain.

- t_verify(w): the verifier's compute for a block of w draft tokens (one forward over w + 1 positions).
  A decayed mean per observed width, seeded from the verifier's profile table; the curve over every
  width is a monotone (isotonic) fit of the observed ones, linear between them, extrapolated with the
  fit's least-squares slope (with one width known: ``default_slope``). A width not observed yet keeps the
  profile's figure scaled by what the observed widths cost against the profile: a profile timed while the
  machine was busy (a gateway and its verifier starting beside another, BENCHMARKS.md, thirty-fifth session:
  every width timed at ~2x) would otherwise price the widths no round tried at the busy figure for ever,
  and a choice that never tries them never learns better.
- t_draft(k, n) = (k - n) * ms per model-drafted token + n * ms per lookup token (copies cost next to
  nothing and are measured apart). A call that finds the drafter behind (a session new to it, or the
  tokens of a plain streak, more than ``CATCH_UP_FREE``) first reads the unseen context:
  ``catch_up_ms``, measured per token apart from the drafting.
- overhead_plain: what a round spends outside the two models' compute on the gateway <-> verifier link
  (network, serialization); overhead_speculative = overhead_plain + the drafter's round trip. Both are
  decayed means of ``round_ms - draft_ms - verify_ms``; a speculative round whose Propose call was
  timed also measures the plain part. Until a speculative round is measured, the drafter's round trip
  is the one a ping measured (``seed_drafter_round_trip``).

Several clients at once: the verifier batches the blocks of the sessions waiting into one forward
(``VerifyOutcome.forward_rows``: this block's rows and the others'). A verify time is learned at the
width of the whole forward (its rows - 1), and ``other_rows`` is a decayed mean of the rows other
sessions bring. With o of them, a block of k draft tokens makes this session's round cost t_verify(o) plus
the rise its k rows add, and holds up each of the o others' rounds by that rise; the choice counts that
delay against the block too (its cost is the session's round plus o times the delay it adds), so as more
sessions share the forward, only blocks that are likely accepted are drafted: a draft row's compute then
takes a share of a forward that every session waits for. With no other rows the rule is the
single-session one. The rise keeps the shape of the verifier's start-up profile (``seed``: its cost per
width, measured alone), scaled by what forwards of o rows cost now against the profile: the curve learned
under load pools forwards whose cost moves with more than their width (prompt rows riding along, how many
sessions' caches they read), and its fit goes flat (8 clients on a 2-core host: the same 8.4 ms from width
2 to 8), which made every draft row look free to the others.

A model drafter on the verifier's cores (``shared_cpus``: one box, ``tandem up``'s default) drafts while the
verifier runs the other sessions' forward, and takes a core from it: a drafted token's time is then
counted once for this session's round and once for each of the o others (the forward they wait for runs
about that much longer), the same form as the delay a draft row adds.

The draft cost, the verify cost and the drafter's round trip are learned apart (``draft_ms_per_token``,
``verify_curve``, ``drafter_round_trip_ms``); ``round_curve`` adds them up. Unobserved figures default
to 0 (optimism under uncertainty): a wrong guess is tried once, measured and corrected, whereas a
pessimistic one would never be revisited.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.draft_length.figures import RoundFigures

CATCH_UP_FREE = 16      # context tokens a drafter call reads at no extra cost (those a drafting round brings)


@dataclass
class _Ewma:
    """A bias-corrected exponentially weighted mean: the first observations average, later ones decay
    with weight ``alpha``. A seed counts as ``seed_weight`` observations."""

    alpha: float
    mean: float = 0.0
    n: float = 0.0          # observations so far (seed included)

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


class CostModel:
    """Measured costs of one verifier + drafter pair, learned online with decayed means (module docstring)."""

    def __init__(self, alpha: float = 0.15, default_slope: float = 0.25, shared_cpus: bool = False):
        """``alpha``: weight of a new observation. ``default_slope``: with a single width measured,
        verify ms is extrapolated as v(w) = v0 * (1 + default_slope * w). ``shared_cpus``: the drafter runs
        on the verifier's cores, so its drafting also delays the forward other sessions wait for."""
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = float(alpha)
        self.default_slope = float(default_slope)
        self.shared_cpus = bool(shared_cpus)
        self._verify: dict[int, _Ewma] = {}
        self._draft_per_token = _Ewma(alpha)
        self._lookup_per_token = _Ewma(alpha)
        self._catch_up_per_token = _Ewma(alpha)
        self._plain_overhead = _Ewma(alpha)
        self._spec_overhead = _Ewma(alpha)
        self._others = _Ewma(alpha)             # other sessions' rows in the forwards that verified ours
        self._pinged_round_trip = 0.0          # a ping of the drafter (GetInfo), until Propose calls are measured
        self._fit: list[tuple[int, float]] | None = None
        self._curve: list[float] = []          # verify ms per width 0.., read off the current fit
        self._profile: list[tuple[int, float]] = []      # the seed table (the verifier's profile, alone)
        self._observed: set[int] = set()       # widths some round was verified at (not only seeded)
        self.rounds_observed = 0

    # ---- learning ---------------------------------------------------------------------------------
    def seed(self, table: Mapping[int, float], weight: float = 1.0) -> None:
        """Seeds verify ms per width from a profile table {width: ms} (the verifier's GetInfo). A seed
        counts as ``weight`` observations: measurements take over."""
        for w, ms in table.items():
            if int(w) < 0 or not math.isfinite(float(ms)) or float(ms) < 0:
                raise ValueError(f"bad profile entry {w}: {ms}")
            self._verify.setdefault(int(w), _Ewma(self.alpha)).seed(float(ms), weight)
        self._profile = _isotonic(sorted((int(w), float(ms), 1.0) for w, ms in table.items()))
        self._fit = None

    def seed_drafter_round_trip(self, ms: float) -> None:
        """The drafter's round trip as a ping measured it: until rounds that call the drafter are measured,
        a speculative round's overhead is the plain one plus this."""
        if not math.isfinite(float(ms)) or float(ms) < 0:
            raise ValueError(f"bad drafter round trip: {ms}")
        self._pinged_round_trip = float(ms)

    def observe(self, fig: RoundFigures) -> None:
        """Learns from one round (not the prefill)."""
        self.rounds_observed += 1
        others = fig.other_rows
        self._others.add(float(others))
        self._verify.setdefault(fig.width + others, _Ewma(self.alpha)).add(max(0.0, fig.verify_ms))
        self._observed.add(fig.width + others)
        self._fit = None
        if not fig.speculative:
            self._plain_overhead.add(max(0.0, fig.round_ms - fig.verify_ms))
            return
        model, lookup = fig.model_tokens, fig.lookup_tokens
        if model > 0:
            lookup_ms = lookup * self._lookup_per_token.mean if self._lookup_per_token.known else 0.0
            model_ms = max(0.0, fig.draft_ms - lookup_ms)
            if fig.catch_up <= CATCH_UP_FREE:
                self._draft_per_token.add(model_ms / model)
            else:       # the drafter read the unseen context before drafting
                self._catch_up_per_token.add(max(0.0, model_ms - model * self._draft_per_token.mean) / fig.catch_up)
        elif lookup > 0:
            self._lookup_per_token.add(max(0.0, fig.draft_ms) / lookup)
        self._spec_overhead.add(max(0.0, fig.round_ms - fig.draft_ms - fig.verify_ms))
        if fig.propose_wall_ms is not None:     # the plain part, measured apart from the drafter's link
            self._plain_overhead.add(max(0.0, fig.round_ms - fig.propose_wall_ms - fig.verify_ms))

    # ---- verify -----------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Whether any verify cost is known (seeded or measured): without one no choice is meaningful."""
        return any(e.known for e in self._verify.values())

    def _points(self) -> list[tuple[int, float]]:
        if self._fit is None:
            scale = self._profile_scale()
            pts = sorted((w, e.mean if w in self._observed else e.mean * scale, e.n)
                         for w, e in self._verify.items() if e.known)
            self._fit = _isotonic(pts) if pts else []
            self._curve = []
        return self._fit

    def _profile_scale(self) -> float:
        """What the observed widths cost now against the profile's figures for them (1: none observed): the
        factor a width known only from the profile is read at (module docstring)."""
        seeded = dict(self._profile)
        both = [(self._verify[w].mean, seeded[w]) for w in self._observed if seeded.get(w, 0.0) > 0.0]
        if not both:
            return 1.0
        return sum(m for m, _ in both) / sum(p for _, p in both)

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

    def _read(self, widths: range, pts: list[tuple[int, float]] | None = None) -> list[float]:
        """The fit (or ``pts``) read at increasing ``widths``: linear between measured widths; outside them, the
        least-squares slope of the monotone fit (robust to one noisy end point, which a two-point slope
        would amplify over many widths); with one width measured, ``default_slope``."""
        pts = self._points() if pts is None else pts
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

    # ---- draft and overheads ----------------------------------------------------------------------
    @property
    def draft_ms_per_token(self) -> float:
        return self._draft_per_token.mean

    @property
    def lookup_ms_per_token(self) -> float:
        return self._lookup_per_token.mean

    def catch_up_ms(self, tokens: int) -> float:
        """What the drafter spends reading ``tokens`` of context it has not seen before it drafts: 0 up to
        ``CATCH_UP_FREE`` (a drafting round's own few, in ``draft_ms_per_token``), measured per token beyond."""
        return self._catch_up_per_token.mean * tokens if tokens > CATCH_UP_FREE else 0.0

    @property
    def plain_overhead_ms(self) -> float:
        return self._plain_overhead.mean

    @property
    def speculative_overhead_ms(self) -> float:
        """Overhead of a round that calls the drafter; at least the plain one (it adds the drafter's round trip)."""
        if not self._spec_overhead.known:
            return self._plain_overhead.mean + self._pinged_round_trip
        return max(self._spec_overhead.mean, self._plain_overhead.mean)

    @property
    def drafter_round_trip_ms(self) -> float:
        return self.speculative_overhead_ms - self.plain_overhead_ms

    # ---- rounds -----------------------------------------------------------------------------------
    @property
    def other_rows(self) -> int:
        """Rows other sessions' blocks are expected to bring to the forward that verifies ours (decayed mean,
        rounded; 0 for a lone session)."""
        return int(round(self._others.mean)) if self._others.known else 0

    def _batched_verify(self, top: int) -> list[float]:
        """What a block of k = 0..top draft tokens costs in verify time, with ``other_rows`` sharing the
        forward: this session's round, t(o + k), plus the delay it adds to the o others' rounds,
        o * (t(o + k) - t(o)) (module docstring). ``verify_curve`` when o = 0."""
        o = self.other_rows
        curve = self.verify_curve(top + o)
        if not o:
            return curve[:top + 1]
        if len(self._profile) > 1:              # the rise of k rows from the profile's shape, at today's scale
            profile = self._read(range(o, o + top + 1), self._profile)
            scale = max(1.0, curve[o] / profile[0]) if profile[0] > 0 else 1.0
            rise = [scale * (p - profile[0]) for p in profile]
        else:
            rise = [curve[o + k] - curve[o] for k in range(top + 1)]
        return [curve[o] + rise[k] + o * rise[k] for k in range(top + 1)]

    def round_curve(self, top: int, lookup_tokens: int = 0) -> list[float]:
        """Expected wall ms of a round for k = 0..top (the first ``lookup_tokens`` of a block copied by the
        drafter's lookup). k = 0 is a plain step: verify at width 0 and the plain overhead, no draft and
        no drafter round trip. Other sessions' rows in the forward: ``_batched_verify``."""
        verify = self._batched_verify(top)
        overhead = self.speculative_overhead_ms         # the plain overhead and the drafter's round trip
        # on the verifier's cores the drafter's time also comes out of the forward the o others wait for
        share = 1 + self.other_rows if self.shared_cpus else 1
        per_model, per_lookup = share * self._draft_per_token.mean, share * self._lookup_per_token.mean
        lookup = max(0, lookup_tokens)
        out = [verify[0] + self._plain_overhead.mean]
        for k in range(1, top + 1):
            n = lookup if lookup < k else k             # k - n model tokens and n lookup copies
            draft = (k - n) * per_model + n * per_lookup
            out.append(draft + verify[k] + overhead)
        return out

    def copied_round_curve(self, top: int) -> list[float]:
        """Expected wall ms of a round for k = 0..top whose block the gateway copies by prompt lookup itself:
        no drafter call, so no draft time and no drafter round trip."""
        plain = self._plain_overhead.mean
        return [v + plain for v in self._batched_verify(top)]

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
                   other_rows=round(self._others.mean, 4),
                   rounds_observed=float(self.rounds_observed))
        return out
