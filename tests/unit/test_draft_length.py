"""gateway.draft_length: the cost model, the acceptance estimator, the choice of k and the probing policy,
on hand-built cost tables and acceptance figures, and simulated sessions with known truth."""

from __future__ import annotations

import random

import pytest

from gateway.draft_length import (COPYING_PRIOR_WEIGHT, PRIOR_WEIGHT, AcceptanceEstimator, AutoDraftLength,
                                  CostModel, PinnedDraftLength, ProbeRule, ProbeSchedule, RoundFigures, choose_k,
                                  expected_tokens)
from tandem.types import DraftToken, Proposal, VerifyOutcome


def flat_acceptance(a: float, lookup: float = 0.8) -> AcceptanceEstimator:
    """An estimator with no observations: every model position at ``a``, lookup tokens at ``lookup``."""
    return AcceptanceEstimator(default=a, default_lookup=lookup)


def cost_model(verify: dict[int, float], draft_per_token: float = 0.0, plain_oh: float = 0.0,
               spec_oh: float | None = None) -> CostModel:
    """A cost model seeded with the verify table (which has width 0), then one plain and one speculative round
    observed at its figures (a decayed mean's first observation is its value): ``draft_per_token`` ms a drafted
    token, ``plain_oh`` ms of overhead on a plain round, ``spec_oh`` (default: ``plain_oh``) on a speculative one."""
    cost = CostModel()
    cost.seed(verify)
    cost.observe(RoundFigures(width=0, accepted=0, verify_ms=verify[0], round_ms=verify[0] + plain_oh))
    w = min(w for w in verify if w > 0)
    spec = plain_oh if spec_oh is None else spec_oh
    cost.observe(RoundFigures(width=w, accepted=0, verify_ms=verify[w], draft_ms=w * draft_per_token,
                              round_ms=verify[w] + w * draft_per_token + spec))
    return cost


def model_acceptance(acc: AcceptanceEstimator, i: int) -> float:
    """a_{i+1}: the estimate for the i-th (0-based) model-drafted token of a block."""
    return acc.model_acceptances(i + 1)[i]


# ---- the choice ------------------------------------------------------------------------------------
def test_plain_when_verify_of_width_one_costs_more_than_the_tokens_it_brings():
    cost = cost_model({0: 10.0, 1: 17.0})              # t_verify(1) / t_verify(0) = 1.7
    assert choose_k(cost, flat_acceptance(0.6), 1).k == 0      # 1 + a_1 = 1.6 < 1.7
    assert choose_k(cost, flat_acceptance(0.8), 1).k == 1      # 1.8 > 1.7


def test_decision_lists_every_candidate_and_plain_has_no_draft_cost_or_drafter_trip():
    cost = cost_model({0: 10.0, 4: 12.0}, draft_per_token=1.0, plain_oh=0.5, spec_oh=3.0)
    d = choose_k(cost, flat_acceptance(0.7), 4)
    assert [c.k for c in d.candidates] == [0, 1, 2, 3, 4]
    plain = d.candidates[0]
    assert plain.expected_tokens == 1.0 and plain.expected_ms == pytest.approx(10.5)
    c2 = d.candidates[2]
    assert c2.expected_tokens == pytest.approx(1 + 0.7 + 0.49)
    assert c2.expected_ms == pytest.approx(2 * 1.0 + 11.0 + 3.0)
    best = max(d.candidates, key=lambda c: c.tokens_per_ms)
    assert (d.k, d.tokens_per_ms) == (best.k, best.tokens_per_ms)
    assert d.candidates[d.k].tokens_per_ms == d.tokens_per_ms


def test_tokens_drafted_ahead_cost_neither_drafter_time_nor_the_round_trip():
    """A slow drafter behind a slow link: asking it costs more than its tokens bring, so a block pays only when
    its tokens were drafted ahead (already at the gateway); then it costs what a copied block costs."""
    cost = cost_model({0: 10.0, 1: 11.0, 2: 12.0, 3: 13.0}, draft_per_token=4.0, plain_oh=0.5, spec_oh=10.5)
    acc = flat_acceptance(0.6)
    assert choose_k(cost, acc, 3).k == 0
    d = choose_k(cost, acc, 3, ready=(False, False))
    assert d.k == 2 and d.candidates[2].expected_ms == pytest.approx(12.0 + 0.5)
    assert d.candidates[2].expected_tokens == pytest.approx(1 + 0.6 + 0.36)
    # tokens copied from text (a suffix or lookup drafter's) count at the copies' acceptance
    copies = choose_k(cost, flat_acceptance(0.6, lookup=0.9), 3, ready=(True, True))
    assert copies.candidates[2].expected_tokens == pytest.approx(1 + 0.9 + 0.81)
    # beyond the ready tokens a block pays the drafter for the rest only (and its round trip)
    assert d.candidates[3].expected_ms == pytest.approx(1 * 4.0 + 13.0 + 10.5)


def test_beside_a_copying_node_one_kept_block_wins_a_session_back_from_the_gateways_figures():
    """A suffix node's tokens are right on text it saw before and wrong on new text. After many rejected blocks
    (new text) the gateway-wide figures are near 0; a session whose first block was all kept (a repeated
    answer) trusts its own round beside such a node, and hardly moves with the default weight of the prior."""
    gateway = AcceptanceEstimator(alpha=0.02)
    for _ in range(200):
        gateway.observe_block((False,) * 4, accepted=0)

    def after_one_kept_block(weight):
        session = AcceptanceEstimator(prior=gateway, prior_weight=weight, share=False)
        session.observe_block((False,) * 4, accepted=4)
        return session.model_acceptances(4)

    assert min(after_one_kept_block(COPYING_PRIOR_WEIGHT)) > 0.7
    assert max(after_one_kept_block(PRIOR_WEIGHT)) < 0.3


def test_suffix_copies_are_priced_by_the_match_they_stand_on():
    """A copying node's tokens are right where they continue text seen word for word (a long match) and often
    wrong where they stand on a few tokens (new text). Learned per match length, a path drafted ahead on a long
    match is verified in long blocks, one on a short match not at all, whatever the session's other figures say."""
    gateway = AcceptanceEstimator(default_lookup=0.1)
    for _ in range(30):
        gateway.observe_block((True,) * 4, accepted=4, matches=(40, 41, 42, 43))    # a repeat: all kept
        gateway.observe_block((True,) * 4, accepted=0, matches=(2, 3, 4, 5))        # new text: the first rejected
    session = AcceptanceEstimator(prior=gateway, prior_weight=COPYING_PRIOR_WEIGHT)
    assert session.match_acceptance(40) > 0.9 and session.match_acceptance(2) < 0.1
    assert session.lookup_acceptance() == pytest.approx(0.1)    # the copies' general figure: untouched by these
    cost = cost_model({w: 4.0 + 1.0 * w for w in range(9)}, plain_oh=0.4)
    long = choose_k(cost, session, 8, ready=(True,) * 8, ready_matches=tuple(range(40, 48)))
    short = choose_k(cost, session, 8, ready=(True,) * 8, ready_matches=tuple(range(2, 10)))
    unknown = choose_k(cost, session, 8, ready=(True,) * 8)              # no match reported: the copies' figure
    assert long.k >= 6 and short.k == 0 and unknown.k == 0


def test_a_path_drafted_ahead_takes_the_round_from_the_gateways_copy_when_expected_to_keep_more():
    cost = cost_model({w: 4.0 + 1.0 * w for w in range(9)}, plain_oh=0.4)
    acc = AcceptanceEstimator(default_lookup=0.3)       # the gateway's copies: a 3-token match, often wrong
    for _ in range(20):
        acc.observe_block((True,) * 2, accepted=2, matches=(33, 34))
    d = choose_k(cost, acc, 4, lookup_available=4, lookup_ngram=3, local_lookup=True, ready=(True,) * 4,
                 ready_matches=(33, 34, 35, 36))
    assert d.k == 4 and d.ready and d.candidates[4].ready
    copy = choose_k(cost, acc, 4, lookup_available=4, lookup_ngram=3, local_lookup=True, ready=(True,) * 4,
                    ready_matches=(1, 1, 1, 1))     # no better than the copy: the gateway copies
    assert not copy.ready and not any(c.ready for c in copy.candidates)


def test_long_block_when_verify_is_flat_and_acceptance_high():
    cost = cost_model({0: 10.0, 8: 10.4}, draft_per_token=0.2, plain_oh=0.2, spec_oh=0.5)
    assert choose_k(cost, flat_acceptance(0.9), 8).k >= 6
    assert choose_k(cost, flat_acceptance(0.3), 8).k <= 2


def test_slow_link_lengthens_the_block():
    verify = {w: 10.0 * (1 + 0.1 * w) for w in range(9)}
    near = choose_k(cost_model(verify, 0.5, 0.2, 0.7), flat_acceptance(0.75), 12)
    far = choose_k(cost_model(verify, 0.5, 0.2, 8.0), flat_acceptance(0.75), 12)
    assert far.k > near.k > 0
    # and on a slow link, a drafter that is too weak to pay for the trip is switched off
    assert choose_k(cost_model(verify, 0.5, 0.2, 20.0), flat_acceptance(0.4), 12).k == 0


def test_k_max_bounds_the_choice_and_zero_budget_is_plain():
    cost = cost_model({0: 10.0, 8: 10.0})
    assert choose_k(cost, flat_acceptance(0.95), 3).k == 3
    d = choose_k(cost, flat_acceptance(0.95), 0)
    assert d.k == 0 and d.reason == "no-budget" and len(d.candidates) == 1


def test_expected_tokens():
    assert expected_tokens([]) == 1.0
    assert expected_tokens([0.5, 0.5]) == pytest.approx(1.75)
    # constant acceptance: docs/DESIGN.md's (1 - a^(k+1)) / (1 - a)
    assert expected_tokens([0.7] * 5) == pytest.approx((1 - 0.7 ** 6) / 0.3)


def test_lookup_tokens_raise_expected_tokens_and_cut_draft_cost():
    cost = cost_model({0: 10.0, 4: 10.4}, draft_per_token=1.0, spec_oh=0.5)
    cost.observe(RoundFigures(width=4, accepted=4, verify_ms=10.4, round_ms=11.0, draft_ms=0.04,
                              from_lookup=(True,) * 4))            # lookup-only block: 0.01 ms a token
    assert cost.lookup_ms_per_token == pytest.approx(0.01)
    assert cost.round_curve(4, lookup_tokens=4)[4] < cost.round_curve(4)[4] - 3.5
    acc = flat_acceptance(0.5, lookup=0.9)
    plain = choose_k(cost, acc, 4)
    looked = choose_k(cost, acc, 4, lookup_available=3)
    assert looked.candidates[3].expected_tokens == pytest.approx(expected_tokens([0.9] * 3))
    assert looked.candidates[4].expected_tokens == pytest.approx(expected_tokens([0.9, 0.9, 0.9, 0.5]))
    assert looked.tokens_per_ms > plain.tokens_per_ms


# ---- the cost model ----------------------------------------------------------------------------------
def test_verify_interpolation_is_monotone_and_sensible():
    cost = CostModel()
    cost.seed({0: 10.0, 2: 9.0, 4: 14.0, 8: 22.0})            # 2 < 0: noise, pooled by the monotone fit
    values = [cost.verify_ms(w) for w in range(17)]
    assert all(b >= a for a, b in zip(values, values[1:]))
    assert cost.verify_ms(0) == pytest.approx(9.5) == cost.verify_ms(2)
    assert cost.verify_ms(6) == pytest.approx(18.0)            # halfway between 4 and 8
    assert cost.verify_ms(12) > cost.verify_ms(8)              # extrapolated with a positive slope
    single = CostModel(default_slope=0.25)
    single.seed({2: 15.0})                                    # one width: v(w) = v0 (1 + 0.25 w)
    assert single.verify_ms(0) == pytest.approx(10.0)
    assert single.verify_ms(4) == pytest.approx(20.0)
    assert not CostModel().ready and single.ready


def test_widths_no_round_tried_are_priced_as_the_observed_ones_moved_from_the_profile():
    """A profile timed on a busy machine (every width ~2x) must not price the widths no round has tried at
    the busy figure for ever: they follow the observed widths' ratio to the profile."""
    busy = {w: 2.0 * (8.5 + 5.0 * w) for w in range(9)}       # the true cost is 8.5 + 5 w
    cost = CostModel()
    cost.seed(busy)
    for _ in range(30):
        cost.observe(RoundFigures(width=0, accepted=0, verify_ms=8.5, round_ms=9.0))
        cost.observe(RoundFigures(width=1, accepted=1, verify_ms=13.5, round_ms=14.0, draft_ms=0.0))
    assert cost.verify_ms(1) == pytest.approx(13.5, rel=0.02)
    assert cost.verify_ms(4) == pytest.approx(28.5, rel=0.05)      # 57 in the profile, scaled by ~0.5
    assert cost.verify_ms(8) == pytest.approx(48.5, rel=0.05)
    fresh = CostModel()
    fresh.seed(busy)                                             # nothing observed: the profile as it is
    assert fresh.verify_ms(4) == pytest.approx(57.0)


def test_decayed_means_converge_to_a_changed_cost():
    cost = CostModel(alpha=0.15)
    cost.seed({0: 5.0, 2: 5.0})

    def rnd(verify, draft, overhead):
        return RoundFigures(width=2, accepted=1, verify_ms=verify, draft_ms=draft, round_ms=verify + draft + overhead)

    for _ in range(40):
        cost.observe(rnd(10.0, 2.0, 1.0))
    assert cost.verify_ms(2) == pytest.approx(10.0, rel=0.01)
    assert cost.draft_ms_per_token == pytest.approx(1.0, rel=0.01)
    for _ in range(40):
        cost.observe(rnd(20.0, 4.0, 3.0))                     # the machine got busy, the link slower
    assert cost.verify_ms(2) == pytest.approx(20.0, rel=0.02)
    assert cost.draft_ms_per_token == pytest.approx(2.0, rel=0.02)
    assert cost.speculative_overhead_ms == pytest.approx(3.0, rel=0.02)


def test_overheads_split_the_drafter_round_trip():
    cost = CostModel()
    cost.seed({0: 10.0})
    for _ in range(30):
        cost.observe(RoundFigures(width=0, accepted=0, verify_ms=10.0, round_ms=10.5))            # plain
        cost.observe(RoundFigures(width=2, accepted=2, verify_ms=11.0, draft_ms=2.0, round_ms=21.5))
    assert cost.plain_overhead_ms == pytest.approx(0.5, rel=0.01)
    assert cost.speculative_overhead_ms == pytest.approx(8.5, rel=0.01)
    assert cost.drafter_round_trip_ms == pytest.approx(8.0, rel=0.02)
    assert cost.round_curve(0)[0] == pytest.approx(10.5, rel=0.01)           # no trip to the drafter
    table = cost.table()
    assert table["drafter_round_trip_ms"] == pytest.approx(8.0, rel=0.02) and "verify_ms_w4" in table
    # a timed Propose call measures the plain part on speculative rounds too
    timed = CostModel()
    for _ in range(30):
        timed.observe(RoundFigures(width=2, accepted=2, verify_ms=11.0, draft_ms=2.0, round_ms=21.5,
                                   propose_wall_ms=10.0))
    assert timed.plain_overhead_ms == pytest.approx(0.5, rel=0.01)


def test_figures_from_proposal_and_outcome():
    proposal = Proposal((DraftToken(5, from_lookup=True), DraftToken(6), DraftToken(7)), compute_ms=2.0)
    fig = RoundFigures.from_outcome(proposal, VerifyOutcome(1, 9, False, compute_ms=11.0), round_ms=15.0)
    assert (fig.width, fig.accepted, fig.lookup_tokens, fig.model_tokens) == (3, 1, 1, 2)
    assert fig.speculative and fig.verify_ms == 11.0 and fig.draft_ms == 2.0
    empty = RoundFigures.from_outcome(Proposal(()), VerifyOutcome(0, 9, False, 10.0), 10.5)
    assert not empty.speculative
    with pytest.raises(ValueError):
        RoundFigures(width=2, accepted=3, verify_ms=1.0, round_ms=1.0)


# ---- acceptance ---------------------------------------------------------------------------------------
def test_acceptance_is_conditional_and_censored_after_the_first_rejection():
    acc = AcceptanceEstimator(alpha=0.1, prior_weight=0.0)
    for _ in range(20):
        acc.observe_block((False,) * 4, accepted=1)           # 0 accepted, 1 rejected, 2 and 3 unseen
    assert model_acceptance(acc, 0) == pytest.approx(0.995)    # clipped below 1
    assert model_acceptance(acc, 1) == pytest.approx(0.001)    # clipped above 0
    assert [s.t for s in acc._model] == [20, 20]


def test_lookup_acceptance_is_learned_apart():
    acc = AcceptanceEstimator(alpha=0.2, default=0.5, default_lookup=0.5)
    for _ in range(30):
        acc.observe_block((True, True, False, False), accepted=3)   # lookups kept, 1st model kept, 2nd not
    assert acc.lookup_acceptance() > 0.95
    assert model_acceptance(acc, 0) > 0.95                     # model tokens counted from the first model token
    assert model_acceptance(acc, 1) < 0.05


def test_session_starts_from_the_gateway_figures_then_follows_its_own():
    gateway = AcceptanceEstimator(alpha=0.02)
    for _ in range(200):
        gateway.observe_block((False, False), accepted=1)     # other sessions: a1 ~ 1, a2 ~ 0
    session = AcceptanceEstimator(alpha=0.1, prior=gateway)
    assert model_acceptance(session, 0) == pytest.approx(model_acceptance(gateway, 0))
    assert model_acceptance(session, 1) == pytest.approx(model_acceptance(gateway, 1))
    one = AcceptanceEstimator(alpha=0.1, prior=gateway)
    one.observe_block((False,), accepted=0)                    # one early rejection: not driven to 0
    assert model_acceptance(one, 0) > 0.6
    for _ in range(60):
        session.observe_block((False, False), accepted=2)     # this session: both accepted
    assert model_acceptance(session, 1) > 0.9
    assert model_acceptance(gateway, 1) > 0.05                 # shared, but the gateway moves slowly


def test_relax_drifts_stale_session_figures_back_to_the_prior():
    gateway = AcceptanceEstimator(alpha=0.02)
    for _ in range(200):
        gateway.observe_block((False,), accepted=1)
    session = AcceptanceEstimator(alpha=0.1, prior=gateway, share=False)
    for _ in range(30):
        session.observe_block((False,), accepted=0)
    low = model_acceptance(session, 0)
    for _ in range(100):
        session.relax(0.02)
    assert low < 0.1 < 0.7 < model_acceptance(session, 0)


# ---- the policy --------------------------------------------------------------------------------------
def losing_policy(**probing) -> AutoDraftLength:
    """A drafter that never pays: plain wins the choice every round."""
    cost = cost_model({0: 10.0, 1: 15.0, 2: 20.0}, draft_per_token=1.0, plain_oh=0.1, spec_oh=0.5)
    return AutoDraftLength(cost, AcceptanceEstimator(default=0.01), probing=ProbeRule(**probing))


def flat_losing_policy(**probing) -> AutoDraftLength:
    """A drafter that never pays, against a nearly flat verify curve (a refused probe predicted at ~5 %)."""
    cost = cost_model({0: 10.0, 1: 10.3, 2: 10.6}, draft_per_token=0.1, plain_oh=0.1, spec_oh=0.2)
    return AutoDraftLength(cost, AcceptanceEstimator(default=0.001, prior_weight=50.0), probing=ProbeRule(**probing))


def plain_round() -> RoundFigures:
    return RoundFigures(width=0, accepted=0, verify_ms=10.0, round_ms=10.1)


def test_probing_schedule_doubles_while_probes_lose_up_to_the_cap_and_resets_on_a_win():
    # no budget: the doubling alone (with one, the budget's interval comes first: the next test)
    policy = losing_policy(every=4, cap=32, budget=0.0)
    probes = []
    for rnd in range(1, 200):
        d = policy.next_k(8)
        if d.reason == "probe":
            assert d.k == 1                                    # the most promising short block
            probes.append(rnd)
            policy.observe(RoundFigures(width=1, accepted=0, verify_ms=15.0, draft_ms=1.0, round_ms=16.5))
        else:
            assert d.k == 0
            policy.observe(plain_round())
    assert probes == [4, 12, 28, 60, 92, 124, 156, 188]      # intervals 4, 8, 16, 32 (cap), 32, ...
    # a winning probe (the block was accepted and the round was quick) resets the interval
    policy = losing_policy(every=4, cap=64, budget=0.0)
    seen = []
    for rnd in range(1, 60):
        d = policy.next_k(8)
        if d.reason == "probe":
            seen.append(rnd)
            won = rnd == 12
            policy.observe(RoundFigures(width=1, accepted=int(won), verify_ms=15.0, draft_ms=1.0,
                                        round_ms=12.0 if won else 16.5))
        else:
            policy.observe(plain_round())
    assert seen[:4] == [4, 12, 16, 24]                         # 4, then 8; win at 12: 4 again, then 8


def test_the_probe_budget_holds_from_the_first_probe():
    """A fresh gateway whose probes cost 65 % more than a plain round: doubling from every 4th round would
    spend 0.65 x 6 plain rounds on refused probes in the first 230 rounds (1.7 %, twice the budget). After
    the first refused probe the interval jumps to what keeps the probes since the last reset within the
    budget."""
    policy = losing_policy(every=4, cap=256, budget=0.01)
    probes, spent = [], 0.0
    for rnd in range(1, 1000):
        d = policy.next_k(8)
        if d.reason == "probe":
            probes.append(rnd)
            policy.observe(RoundFigures(width=1, accepted=0, verify_ms=15.0, draft_ms=1.0, round_ms=16.5))
            spent += 16.5 / 10.1 - 1.0
        else:
            policy.observe(plain_round())
        # the first probe is the one spent ahead; after it, never more than the budget of the rounds so far
        # (doubling had spent 3 probes = 1.9 plain rounds by round 28)
        assert spent <= 0.01 * rnd + 0.64
    assert probes[0] == 4 and probes[1] - probes[0] > 50     # not 8 rounds later, as by doubling
    assert len(probes) >= 14                                 # still probing, about every 64th round


def test_cheap_probes_stay_frequent_and_their_worst_case_cost_stays_within_the_budget():
    """With a nearly flat verify curve a refused probe costs ~5 % of a plain step, so the interval stops
    at ceil(0.05 / probe_budget) instead of doubling to the cap: estimates stay fresh where acceptance is
    bursty, and even a drafter that never pays costs at most ~probe_budget of plain throughput."""
    policy = flat_losing_policy(every=1, cap=64, budget=0.02, max_length=2)   # blocks of <= 2
    spent = {"plain": 0.0, "probe": 0.0}
    probes = []
    for rnd in range(1, 400):
        d = policy.next_k(8)
        if d.reason == "probe":
            probes.append(rnd)
            policy.observe(RoundFigures(width=d.k, accepted=0, verify_ms=10.3, draft_ms=0.1, round_ms=10.6))
            spent["probe"] += 10.6
        else:
            assert d.k == 0
            policy.observe(plain_round())
            spent["plain"] += 10.1
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert probes and max(gaps) <= 4                           # interval <= ceil(0.055 / 0.02) = 3 plain rounds
    worst_loss = len(probes) * (10.6 - 10.1) / (spent["plain"] + spent["probe"])
    assert worst_loss <= 0.02
    # the same drafter against a steep curve (a refused probe costs 60 %) backs off to the cap
    steep = losing_policy(every=4, cap=64, budget=0.02)
    probes = []
    for rnd in range(400):
        d = steep.next_k(8)
        if d.reason == "probe":
            probes.append(rnd)
        steep.observe(RoundFigures(width=1, accepted=0, verify_ms=15.0, draft_ms=1.0, round_ms=16.5)
                      if d.reason == "probe" else plain_round())
    late = [p for p in probes if p > 200]
    assert len(late) > 2 and all(y - x == 32 for x, y in zip(late, late[1:]))   # ceil(0.63 / 0.02) = 32 < cap


def test_pinned_k_is_honoured_and_figures_still_recorded():
    gateway = AcceptanceEstimator(alpha=0.02)
    policy = PinnedDraftLength(cost_model({0: 10.0, 1: 30.0}), AcceptanceEstimator(prior=gateway), 3)
    observed = policy.cost.rounds_observed
    for _ in range(10):
        d = policy.next_k(8)
        assert d.k == 3 and d.reason == "pinned"
        policy.observe(RoundFigures(width=3, accepted=0, verify_ms=30.0, draft_ms=3.0, round_ms=34.0))
    assert policy.next_k(2).k == 2                            # never past the round's budget
    assert policy.cost.rounds_observed == observed + 10
    assert gateway._model[0].t == 10 and model_acceptance(gateway, 0) < 0.6


def test_no_figures_yet_uses_the_fallback_k():
    policy = AutoDraftLength(CostModel(), AcceptanceEstimator(), fallback_k=2)
    d = policy.next_k(8)
    assert (d.k, d.reason) == (2, "no-figures")
    policy.observe(RoundFigures(width=2, accepted=1, verify_ms=10.0, draft_ms=1.0, round_ms=12.0))
    assert policy.next_k(8).reason == "best"


# ---- simulated sessions with known truth -------------------------------------------------------------
class Truth:
    def __init__(self, verify, draft_ms, plain_oh, rtt, acceptance):
        self.verify, self.draft_ms, self.plain_oh, self.rtt = verify, draft_ms, plain_oh, rtt
        self.acceptance = acceptance          # position (0-based) -> conditional acceptance

    def ms(self, k: int) -> float:
        return self.verify(k) + (self.draft_ms * k + self.rtt if k else 0.0) + self.plain_oh

    def tokens_per_ms(self, k: int) -> float:
        return expected_tokens([self.acceptance(i) for i in range(k)]) / self.ms(k)


def simulate(truth: Truth, sessions=12, tokens=300, seed=1234, noise=0.05, k_max=8, policy_kw=None, schedule=None,
             pinned: int | None = None,
             lookup_every: int = 0, lookup_tokens: int = 4, lookup_sent: bool = True, lookup_acceptance: float = 0.9):
    """Realized tokens/ms of auto over several sessions sharing one cost model and gateway-wide prior.
    The cost model is seeded from the verifier's profile (widths 0..4), as GetInfo would.
    ``lookup_every`` N > 0: every N-th round the gateway's lookup predicts ``lookup_tokens`` copies at the
    block's head; the drafter sends them (``lookup_sent``; accepted with ``lookup_acceptance``, nearly free)
    or drafts the block with its model as usual (a drafter served with lookup off)."""
    rng = random.Random(seed)
    cost = CostModel()
    cost.seed({w: truth.verify(w) for w in range(5)})
    gateway = AcceptanceEstimator(alpha=0.02)
    total_tokens = total_ms = 0.0
    ks = []
    for _ in range(sessions):
        acceptance = AcceptanceEstimator(prior=gateway)
        policy = (PinnedDraftLength(cost, acceptance, pinned) if pinned is not None
                  else AutoDraftLength(cost, acceptance, schedule=schedule, **(policy_kw or {})))
        remaining = tokens
        rounds = 0
        while remaining > 0:
            rounds += 1
            predicted = lookup_tokens if lookup_every and rounds % lookup_every == 0 else 0
            k = policy.next_k(min(k_max, remaining - 1), predicted).k
            flags = tuple(i < predicted and lookup_sent for i in range(k))
            n = 0
            while n < k and rng.random() < (lookup_acceptance if flags[n] else truth.acceptance(n)):
                n += 1

            def jitter(x):
                return x * max(0.0, 1.0 + rng.gauss(0.0, noise))

            verify = jitter(truth.verify(k))
            draft = jitter(truth.draft_ms * (k - sum(flags)) + 0.01 * sum(flags)) if k else 0.0
            round_ms = verify + draft + jitter(truth.plain_oh + (truth.rtt if k else 0.0))
            policy.observe(RoundFigures(width=k, accepted=n, verify_ms=verify, draft_ms=draft, round_ms=round_ms,
                                        from_lookup=flags if any(flags) else ()))
            emitted = min(n + 1, remaining)
            remaining -= emitted
            total_tokens += emitted
            total_ms += round_ms
            ks.append(k)
    return total_tokens / total_ms, ks


def fixed(truth: Truth, k_max=8, **kw) -> dict[int, float]:
    """Realized tokens/ms of every fixed k under the same simulation (same seed): the hindsight baseline."""
    return {k: simulate(truth, pinned=k, **kw)[0] for k in range(k_max + 1)}


def test_simulated_amd_like_steep_verify_stays_plain():
    """verify(w=2) = 2 x verify(0), acceptance 0.5: speculation loses; auto must not."""
    truth = Truth(lambda w: 10.0 * (1 + 0.5 * w), 0.5, 0.2, 0.5, lambda i: 0.5)
    assert max(range(9), key=truth.tokens_per_ms) == 0
    baseline = fixed(truth)
    assert max(baseline, key=baseline.get) == 0
    auto, ks = simulate(truth)
    assert auto >= 0.98 * baseline[0]
    assert ks.count(0) > 0.8 * len(ks)


def test_simulated_intel_like_flat_verify_matches_the_best_fixed_k():
    truth = Truth(lambda w: 10.0 * (1 + 0.02 * w), 0.3, 0.2, 0.5, lambda i: 0.7)
    baseline = fixed(truth)
    best = max(baseline, key=baseline.get)
    assert best >= 4 and baseline[best] > 2 * baseline[0]
    auto, _ = simulate(truth)
    assert auto >= 0.97 * baseline[best]


def test_simulated_useless_drafter_is_switched_off():
    truth = Truth(lambda w: 10.0 * (1 + 0.15 * w), 1.0, 0.2, 0.5, lambda i: 0.02)
    baseline = fixed(truth, k_max=4)
    assert baseline[4] < 0.6 * baseline[0]                    # fixed k = 4 is far below plain
    auto, ks = simulate(truth)
    assert auto >= 0.95 * baseline[0]
    assert ks.count(0) > 0.9 * len(ks)


def test_predicted_lookup_that_never_arrives_does_not_keep_a_useless_drafter_on():
    """Predicted lookup copies the drafter does not send (a drafter served with lookup off drafts those
    positions with its model; one that checks lookup drops some) must not make long blocks of a useless
    drafter's tokens look nearly free: the learned yield falls to ~0 and auto stays plain."""
    truth = Truth(lambda w: 20.0 * (1 + 0.04 * w), 0.5, 1.5, 0.5, lambda i: 0.0)
    kw = dict(lookup_every=2, lookup_tokens=6, lookup_sent=False)
    baseline = fixed(truth, k_max=4, **kw)
    assert baseline[4] < 0.85 * baseline[0]
    auto, ks = simulate(truth, **kw)
    assert auto >= 0.95 * baseline[0]
    assert ks.count(0) > 0.7 * len(ks)                        # the rest: cheap probes (verify is nearly flat)
    # no long blocks of useless model tokens (it drafted k = 5..8 in a third of the rounds) but the probes,
    # which on a flat verify curve are k = 4 (what would pay best if the text turned predictable)
    assert sum(k >= 4 for k in ks) < 0.03 * len(ks)


def test_predicted_lookup_that_arrives_is_drafted_even_with_a_useless_model():
    """The control: the same predictions, the drafter sending the copies (accepted 90 %): auto drafts them."""
    truth = Truth(lambda w: 20.0 * (1 + 0.04 * w), 0.5, 1.5, 0.5, lambda i: 0.0)
    kw = dict(lookup_every=2, lookup_tokens=6, lookup_sent=True)
    auto, ks = simulate(truth, **kw)
    plain = fixed(truth, k_max=0, **kw)[0]
    assert auto > 1.3 * plain
    assert sum(k >= 4 for k in ks) > 0.2 * len(ks)


def test_lookup_yield_is_learned_and_shared():
    gateway = AcceptanceEstimator(alpha=0.02)
    session = AcceptanceEstimator(alpha=0.1, prior=gateway)
    assert session.lookup_yield() == 1.0                      # until observed: the drafter's own rule
    for _ in range(30):
        session.observe(RoundFigures(width=4, accepted=0, verify_ms=1, round_ms=1, lookup_predicted=3))
    assert session.lookup_yield() < 0.05
    assert gateway.lookup_yield() < 0.5                       # the gateway-wide figure follows, slowly
    half = AcceptanceEstimator(alpha=0.1, prior_weight=0.0)
    for _ in range(30):
        half.observe(RoundFigures(width=4, accepted=4, verify_ms=1, round_ms=1, from_lookup=(True, True, False, False),
                                  lookup_predicted=4))
    assert half.lookup_yield() == pytest.approx(0.5)          # 2 of the 4 predicted came as copies


def test_short_requests_share_the_probe_schedule():
    """64-token requests with a useless drafter and a steep verify cost (a width-1 probe costs ~60 % more
    than a plain round): restarting every request's schedule at ProbeRule.every would probe far over the
    budget; the gateway-wide schedule keeps probes near it."""
    truth = Truth(lambda w: 7.0 * (1 + 0.2 * w), 1.0, 1.0, 1.4, lambda i: 0.0)
    plain = fixed(truth, k_max=0, sessions=30, tokens=64)[0]
    alone, ks_alone = simulate(truth, sessions=30, tokens=64)
    shared, ks_shared = simulate(truth, sessions=30, tokens=64, schedule=ProbeSchedule())
    assert ks_shared.count(0) > ks_alone.count(0)
    assert shared >= 0.97 * plain
    # rounds since the drafter last drafted count across requests: 64-token requests still get probes (a
    # per-request count never reached an interval longer than a request), about one per ceil(0.6 / 0.005)
    # rounds, the default budget's interval
    drafting = sum(1 for k in ks_shared if k)
    assert 0.005 * len(ks_shared) < drafting < 0.02 * len(ks_shared)
    # the state itself: a second policy starts where the first left it; a win resets it for everyone
    state = ProbeSchedule()
    first = AutoDraftLength(cost_model({0: 10.0, 1: 16.0}), AcceptanceEstimator(default=0.01), schedule=state)
    for _ in range(200):
        k = first.next_k(1).k
        first.observe(RoundFigures(width=k, accepted=0, verify_ms=16.0 if k else 10.0, round_ms=16.0 if k else 10.0))
    assert state.interval > ProbeRule().every
    due = state.interval - state.streak                     # plain rounds until the shared schedule's next probe
    assert due != ProbeRule().every
    second = AutoDraftLength(first.cost, AcceptanceEstimator(default=0.01), schedule=state)
    rounds = 0
    while (d := second.next_k(1)).reason != "probe":
        rounds += 1
        second.observe(RoundFigures(width=0, accepted=0, verify_ms=10.0, round_ms=10.0))
    assert rounds + 1 == due


def test_simulated_slow_link_keeps_speculating_with_longer_blocks():
    truth = Truth(lambda w: 10.0 * (1 + 0.1 * w), 0.5, 0.2, 8.0, lambda i: 0.75)
    baseline = fixed(truth)
    best = max(baseline, key=baseline.get)
    assert baseline[1] < baseline[0] < baseline[best]         # a short block cannot pay for the trip
    auto, ks = simulate(truth)
    assert auto >= 0.90 * baseline[best]                       # 0.92-0.97 over seeds: the weakest case
    spec = [k for k in ks if k]
    assert sum(spec) / len(spec) >= 3


def test_a_session_that_turns_predictable_gets_speculation_back():
    """200 rounds of a useless drafter (plain wins, probes back off), then the text turns predictable."""
    cost = CostModel()
    cost.seed({w: 10.0 * (1 + 0.05 * w) for w in range(5)})
    policy = AutoDraftLength(cost, AcceptanceEstimator(prior=AcceptanceEstimator(alpha=0.02)))
    rng = random.Random(7)
    ks = []
    for rnd in range(600):
        a = 0.02 if rnd < 200 else 0.9
        k = policy.next_k(8).k
        n = 0
        while n < k and rng.random() < a:
            n += 1
        verify = 10.0 * (1 + 0.05 * k)
        policy.observe(RoundFigures(width=k, accepted=n, verify_ms=verify, draft_ms=0.3 * k,
                                    round_ms=verify + 0.3 * k + (0.7 if k else 0.2)))
        ks.append(k)
    # plain while the drafter is useless; a refused probe costs ~13 % of a plain round here, so probes come
    # at most every ceil(0.13 / probe_budget) = 7 plain rounds
    assert ks[150:200].count(0) >= 42
    back = next(i for i in range(200, 600) if all(k > 0 for k in ks[i:i + 20]))
    assert back < 200 + 150                                    # speculating again within 150 rounds
    assert sum(ks[450:]) / 150 >= 4                            # with long blocks


def test_lookup_acceptance_is_learned_per_match_length_and_decides_k():
    """Copies found by a short match are often wrong where long matches (a quote, a repeated line) pay: a
    match on the last token alone must not borrow the acceptance of a 4-gram match."""
    gateway = AcceptanceEstimator(alpha=0.02)
    for _ in range(300):
        gateway.observe_block((True, True, True), accepted=0, ngram=1)     # short matches: rejected
        gateway.observe_block((True, True, True), accepted=3, ngram=4)     # long ones: all kept
    session = AcceptanceEstimator(alpha=0.1, prior=gateway)
    assert session.lookup_acceptance(1) < 0.05
    assert session.lookup_acceptance(4) > 0.95
    assert session.lookup_acceptance(7) == session.lookup_acceptance(4)          # 4+ share one figure
    assert 0.6 < session.lookup_acceptance() < 0.9     # pooled per token: 1 rejected, 3 accepted a pair of blocks
    cost = cost_model({w: 9.2 * (1 + 0.17 * w) for w in range(9)}, draft_per_token=0.7, plain_oh=1.5, spec_oh=3.2)
    assert choose_k(cost, session, 8, lookup_available=3, lookup_ngram=1).k == 0
    assert choose_k(cost, session, 8, lookup_available=3, lookup_ngram=4).k >= 3   # the copies (+ model tokens)
    table = session.table()
    assert table["a_lookup_n1"] < 0.05 and table["a_lookup_n4"] > 0.95


def test_policy_records_the_match_length_of_its_prediction():
    gateway = AcceptanceEstimator(alpha=0.02)
    policy = AutoDraftLength(cost_model({0: 10.0, 1: 10.5, 2: 11.0}), AcceptanceEstimator(prior=gateway))
    policy.next_k(2, lookup_available=2, lookup_ngram=2)
    policy.observe(RoundFigures(width=2, accepted=0, verify_ms=11.0, round_ms=12.0, from_lookup=(True, True)))
    assert gateway._lookup_by_n[2].t == 1 and gateway._lookup_by_n[1].t == 0


def test_probe_budget_counts_what_a_probe_cost_not_what_was_predicted():
    """A probe after a plain streak also pays the drafter's catch-up on the tokens it missed, which the
    gateway-wide cost model (kept cheap by sessions that speculate every round) does not predict: the
    budget must bound the measured cost. Session A never pays (its probes take 16.5 ms against a 10.1 ms
    plain round: 63 % extra, so ceil(0.63 / 0.02) = 32 plain rounds between probes); session B, sharing
    the cost model, drafts cheaply every round."""
    a = flat_losing_policy(every=4, cap=64, budget=0.02)
    b = AutoDraftLength(a.cost, AcceptanceEstimator(default=0.99, prior_weight=50.0))
    probes = []
    for rnd in range(1, 600):
        d = a.next_k(8)
        if d.reason == "probe":
            probes.append(rnd)
            a.observe(RoundFigures(width=d.k, accepted=0, verify_ms=10.3, draft_ms=8.0, round_ms=16.5))
        else:
            a.observe(plain_round())
        d = b.next_k(2)
        assert d.k == 2
        b.observe(RoundFigures(width=2, accepted=2, verify_ms=10.6, draft_ms=0.2, round_ms=11.0))
    late = [p for p in probes if p > 300]
    assert late and all(y - x == 32 for x, y in zip(late, late[1:]))     # a probe every 32nd round


def test_a_block_the_gateway_copies_itself_costs_no_drafter_trip():
    """local_lookup: a block of k <= the lookup tokens available is copied by the gateway, so its cost is
    verify(k) + the plain overhead; on a slow link (30 ms to the drafter) that wins where fetching the
    same block from the drafter loses, and blocks longer than the copy still pay the trip."""
    cost = cost_model({0: 10.0, 1: 10.5, 2: 11.0, 3: 11.5, 4: 12.0}, draft_per_token=1.0, plain_oh=0.5,
                      spec_oh=30.5)
    acc = flat_acceptance(0.3, lookup=0.9)
    fetched = choose_k(cost, acc, 4, lookup_available=3, lookup_ngram=3)
    assert fetched.k == 0
    local = choose_k(cost, acc, 4, lookup_available=3, lookup_ngram=3, local_lookup=True)
    assert local.k == 3
    c3 = local.candidates[3]
    assert c3.expected_ms == pytest.approx(11.5 + 0.5)
    assert c3.expected_tokens == pytest.approx(expected_tokens([0.9, 0.9, 0.9]))
    assert local.candidates[4].expected_ms == fetched.candidates[4].expected_ms      # beyond the copy: fetched


def test_blocks_the_gateway_copies_do_not_probe_the_drafter_or_reset_its_schedule():
    """With local lookup, a copied block that wins says nothing about the drafter: a losing drafter is
    still probed on the doubling schedule (rounds since it last drafted, copied blocks included), and every
    probe is a block the drafter drafts (longer than the copy on offer)."""
    policy = losing_policy(every=4, cap=32, budget=0.0)
    probes, copied = [], 0
    for rnd in range(1, 200):
        lookup = 1 if rnd % 3 == 0 else 0                  # a one-token copy on offer every third round
        d = policy.next_k(8, lookup, 4, local_lookup=True)
        if d.reason == "probe":
            assert d.k > lookup
            probes.append(rnd)
            policy.observe(RoundFigures(width=d.k, accepted=0, verify_ms=15.0, draft_ms=1.0, round_ms=16.5))
        elif d.k:
            assert d.k == 1 == lookup                        # the copy wins: 1.8 tokens for 15.1 ms
            copied += 1
            policy.observe(RoundFigures(width=1, accepted=1, verify_ms=15.0, round_ms=15.1,
                                        from_lookup=(True,), drafter_called=False, lookup_ngram=4))
        else:
            policy.observe(plain_round())
    assert copied > 40
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    # intervals 8, 16, then the cap 32; a probe due on a copy round waits one round
    assert gaps[0] in (8, 9) and gaps[1] in (16, 17) and all(g in (32, 33) for g in gaps[2:]), gaps


def test_with_nothing_but_copies_on_offer_the_copy_itself_is_probed():
    """``--lookup-only`` (no drafter: the budget is the copy on offer). Once the gateway-wide estimate of copies
    fell (a first request whose copies were rejected), every later session would step plainly and its copies
    would never be tried again. The probe is then the copy: refused, it backs off; once the text turns
    predictable, a kept probe brings the copies back."""
    cost = cost_model({0: 10.0, 1: 11.0, 2: 12.0, 3: 13.0, 4: 14.0}, plain_oh=0.1)
    gateway = AcceptanceEstimator()
    for _ in range(40):
        gateway.observe_block((True, True), accepted=0, ngram=2)
    policy = AutoDraftLength(cost, AcceptanceEstimator(prior=gateway), probing=ProbeRule(every=4, cap=64))
    probes, copies = [], []
    for rnd in range(1, 161):
        predictable = rnd > 80
        d = policy.next_k(4, lookup_available=4, lookup_ngram=2, local_lookup=True)
        assert d.k in (0, 4) or d.reason == "probe"
        if d.k:
            (probes if d.reason == "probe" else copies).append(rnd)
            kept = d.k if predictable else 0
            policy.observe(RoundFigures(width=d.k, accepted=kept, verify_ms=10.0 + d.k, round_ms=10.2 + d.k,
                                        from_lookup=(True,) * d.k, drafter_called=False, lookup_ngram=2))
        else:
            policy.observe(plain_round())
    assert [r for r in probes if r <= 80] and not [r for r in copies if r <= 80]     # probed, refused
    gaps = [b - a for a, b in zip(probes, probes[1:]) if b <= 80]
    assert len(probes) < 10 and all(g >= 8 for g in gaps), probes                 # backing off
    back = min(r for r in probes if r > 80)                                        # and back once kept
    assert copies == list(range(back + 1, 161))


def test_beside_a_followed_model_node_a_copy_is_never_the_probe():
    """Beside the target's own file drafting ahead (``ProbeRule.copies`` off), a plain round means its path has
    not arrived yet: the copy on offer, whose estimate fell, is not probed there (it is still chosen where its
    estimate says it pays, as any candidate)."""
    cost = cost_model({0: 10.0, 1: 11.0, 2: 12.0, 3: 13.0, 4: 14.0}, plain_oh=0.1)
    gateway = AcceptanceEstimator()
    for _ in range(40):
        gateway.observe_block((True, True), accepted=0, ngram=2)
    for copies, want_probes in ((True, True), (False, False)):
        policy = AutoDraftLength(cost, AcceptanceEstimator(prior=gateway),
                                 probing=ProbeRule(every=4, cap=64, copies=copies))
        reasons = []
        for _ in range(40):
            d = policy.next_k(4, lookup_available=4, lookup_ngram=2, local_lookup=True)
            reasons.append(d.reason)
            policy.observe(plain_round() if not d.k else
                           RoundFigures(width=d.k, accepted=0, verify_ms=10.0 + d.k, round_ms=10.2 + d.k,
                                        from_lookup=(True,) * d.k, drafter_called=False, lookup_ngram=2))
        assert ("probe" in reasons) == want_probes, reasons


def test_blocks_the_gateway_copies_teach_the_acceptance_of_their_match_length():
    """A copied block (no drafter call) is still verified: its acceptance counts for the length of the match
    that found it, so copies that keep failing stop being chosen."""
    gateway = AcceptanceEstimator(alpha=0.02)
    for _ in range(200):
        gateway.observe_block((True, True, True), accepted=3, ngram=3)     # elsewhere, 3-gram copies pay
    cost = cost_model({w: 5.0 + 0.6 * w for w in range(9)}, draft_per_token=1.0, plain_oh=0.9, spec_oh=2.3)
    policy = AutoDraftLength(cost, AcceptanceEstimator(prior=gateway))
    chosen = []
    for _ in range(20):
        d = policy.next_k(8, 3, 3, local_lookup=True)
        if d.reason != "probe":
            chosen.append(d.k)
        tokens = (DraftToken(1, from_lookup=True),) * d.k
        policy.observe(RoundFigures.from_outcome(Proposal(tokens), VerifyOutcome(0, 2, False, 5.0 + 0.6 * d.k),
                                                 6.0 + 0.6 * d.k, None, drafter_called=False))
    # then at most a one-token copy, at the break-even the estimate has come down to
    assert chosen[0] == 3 and chosen[3] < 3 and max(chosen[6:]) <= 1 and chosen[-8:].count(0) >= 4, chosen
    assert policy.acceptance.lookup_acceptance(3) < 0.15                  # from the prior's 1.0


def test_the_drafter_s_catch_up_is_learned_apart_and_charged_to_the_rest_of_the_request():
    """A drafter call after plain rounds, or the first of a session, first reads the context it has not seen
    (tens of ms for a long prompt against ~1 ms a drafted token). Learned per unseen token, apart from the
    per-token draft cost (which it must not inflate), and charged to a block by its share of what the
    request has left to emit."""
    cost = cost_model({w: 10.0 + 0.5 * w for w in range(9)}, draft_per_token=1.0, plain_oh=1.0, spec_oh=2.0)
    for _ in range(30):
        cost.observe(RoundFigures(width=2, accepted=1, verify_ms=11.0, draft_ms=2.0, round_ms=15.0, catch_up=3))
        cost.observe(RoundFigures(width=1, accepted=0, verify_ms=10.5, draft_ms=1.0 + 60.0, round_ms=64.5,
                                  catch_up=600))
    assert cost.draft_ms_per_token == pytest.approx(1.0)
    assert cost.catch_up_ms(600) == pytest.approx(60.0) and cost.catch_up_ms(10) == 0.0
    assert cost.table()["catch_up_ms_per_token"] == pytest.approx(0.1)
    acc = flat_acceptance(0.7)
    assert choose_k(cost, acc, 8).k >= 2                                            # warm drafter: it pays
    assert choose_k(cost, acc, 8, catch_up_ms=60.0, remaining=1000).k >= 2          # a long request amortises it
    assert choose_k(cost, acc, 8, catch_up_ms=60.0, remaining=5).k == 0             # a short rest does not
    copied = choose_k(cost, acc, 8, lookup_available=3, lookup_ngram=4, local_lookup=True, catch_up_ms=60.0,
                      remaining=30)
    assert copied.k == 3                                                            # a copy needs no drafter
    policy = AutoDraftLength(cost, AcceptanceEstimator(default=0.7))
    assert policy.next_k(8, behind=600, remaining=5).k == 0
    d = policy.next_k(8, behind=2, remaining=5)
    assert d.k >= 2
    policy.observe(RoundFigures(width=d.k, accepted=1, verify_ms=11.0, draft_ms=1.0 * d.k, round_ms=15.0))
    assert cost.draft_ms_per_token == pytest.approx(1.0)                            # a 2-token catch-up: per token
    assert cost.catch_up_ms(600) == pytest.approx(60.0)


def test_a_clear_plain_choice_is_reused_but_never_hides_a_block_that_pays():
    """On a plain streak the choice is not weighed again while it cannot have flipped (its margin over the
    best block, against the relax step a plain round moves the estimates by). A lookup match, less to catch
    up on, or an observed block weighs it again."""
    truth = Truth(lambda w: 10.0 * (1 + 0.5 * w), 0.5, 0.2, 0.5, lambda i: 0.3)
    weighed, held = [simulate(truth, policy_kw={"plain_hold_max": h}) for h in (0, 8)]
    assert held[1].count(0) > 0.9 * len(held[1])
    assert held[0] == pytest.approx(weighed[0], rel=0.01)
    same = sum(a == b for a, b in zip(weighed[1], held[1])) / len(held[1])
    assert same > 0.97
    # the reuse itself, and what ends it (no probes here: probe_every is past the test's rounds)
    policy = losing_policy(budget=0.0, every=1000, cap=1000)
    policy.acceptance = AcceptanceEstimator(default=0.01, default_lookup=0.99)
    calls = []
    original = policy.cost.round_curve

    def counted(*a, **kw):
        calls.append(1)
        return original(*a, **kw)

    policy.cost.round_curve = counted
    for _ in range(18):
        assert policy.next_k(8).k == 0
        policy.observe(plain_round())
    assert 0 < len(calls) <= 2 * 3                          # weighed every 9th round (2 calls each), not 18 times
    calls.clear()
    assert policy.next_k(8, lookup_available=4, lookup_ngram=4, local_lookup=True).k == 4   # a match: weighed
    assert calls
    policy.observe(RoundFigures(width=4, accepted=4, verify_ms=12.0, round_ms=12.5, from_lookup=(True,) * 4,
                                drafter_called=False, lookup_ngram=4))
    calls.clear()
    assert policy.next_k(8).k == 0 and calls                # after an observed block: weighed again
    for _ in range(10):                                      # the drafter's catch-up costs ~0.1 ms a token
        policy.cost.observe(RoundFigures(width=1, accepted=0, verify_ms=15.0, draft_ms=51.0, round_ms=67.0,
                                         catch_up=500))
    assert policy.cost.catch_up_ms(500) > 40
    policy.observe(RoundFigures(width=1, accepted=0, verify_ms=15.0, round_ms=16.0))   # a block: nothing held
    calls.clear()
    policy.next_k(8, behind=500)
    assert calls
    policy.observe(plain_round())
    calls.clear()
    policy.next_k(8, behind=600)                            # more to catch up on: the plain choice stands
    assert not calls
    policy.next_k(8, behind=10)                             # less than when it was held: weighed again
    assert calls


def test_a_probe_drafts_the_block_that_would_pay_if_the_text_turned_predictable():
    """A probe asks whether the drafter pays now; by the losing estimates k = 1 was always the most
    promising, so behind a 10 ms round trip (tests/e2e/test_netns.py, the default pair) every block fetched
    from the drafter was a 1-token probe, which cannot pay for the trip whatever the acceptance. The probe's
    length is the best one at an acceptance of 0.8: longer where the trip costs more."""
    verify = {w: 10.0 + 3.0 * w for w in range(9)}
    probes = {}
    for link, spec_oh in (("loopback", 0.5), ("slow", 10.5)):
        policy = AutoDraftLength(cost_model(verify, draft_per_token=1.0, plain_oh=0.5, spec_oh=spec_oh),
                                 AcceptanceEstimator(default=0.2), probing=ProbeRule(every=4))
        ks = [policy.next_k(8) for _ in range(4)]
        assert [d.k for d in ks[:3]] == [0, 0, 0] and ks[3].reason == "probe"
        by_estimates = max(ks[3].candidates[1:5], key=lambda c: c.tokens_per_ms).k
        assert by_estimates == 1
        probes[link] = ks[3].k
    assert probes == {"loopback": 2, "slow": 4}


def test_a_pinged_round_trip_counts_until_drafter_calls_are_measured():
    """Before any round called the drafter, a speculative round's overhead is the plain one plus the round
    trip a ping measured (the gateway times GetInfo at first use), so the first probe behind a slow link
    is chosen knowing the trip; measured rounds then take over."""
    verify = {w: 10.0 + 3.0 * w for w in range(9)}
    near, far = CostModel(), CostModel()
    for cost in (near, far):                                          # plain rounds only: no drafter call measured
        cost.seed(verify)
        cost.observe(RoundFigures(width=0, accepted=0, verify_ms=10.0, round_ms=10.5))
    far.seed_drafter_round_trip(10.0)
    assert far.speculative_overhead_ms == pytest.approx(10.5) and near.speculative_overhead_ms == pytest.approx(0.5)
    probe = {}
    for name, cost in (("near", near), ("far", far)):
        policy = AutoDraftLength(cost, AcceptanceEstimator(default=0.2), probing=ProbeRule(every=1))
        d = policy.next_k(8)
        assert d.reason == "probe"
        probe[name] = d.k
    assert probe["far"] > probe["near"]
    far.observe(RoundFigures(width=2, accepted=0, verify_ms=16.0, draft_ms=2.0, round_ms=19.0, propose_wall_ms=2.5))
    assert far.speculative_overhead_ms == pytest.approx(1.0)         # measured: 19 - 16 - 2
    with pytest.raises(ValueError):
        far.seed_drafter_round_trip(float("nan"))


def test_other_sessions_rows_in_the_forward_make_blocks_pay_their_share():
    """A verify curve like this 2-core host's (a row ~20 % of a plain step): alone, a drafter accepted at
    0.5 pays for a block; with 3 other sessions' rows in every forward the same block would delay each of
    them by a row, and the choice goes plain; blocks accepted almost surely (a long lookup match) still pay.
    Verify times are learned at the forward's whole width."""
    verify = {w: 20.0 * (1 + 0.2 * w) for w in range(13)}
    alone = cost_model(verify, draft_per_token=0.5, plain_oh=1.0)
    assert alone.other_rows == 0 and choose_k(alone, flat_acceptance(0.5), 4).k >= 1
    shared = cost_model(verify, draft_per_token=0.5, plain_oh=1.0)
    for _ in range(20):        # plain rounds verified in forwards of 4 rows: this session's and 3 others'
        shared.observe(RoundFigures(width=0, accepted=0, verify_ms=verify[3], round_ms=verify[3] + 1.0,
                                    forward_rows=4))
    assert shared.other_rows == 3
    assert shared.verify_ms(3) == pytest.approx(verify[3], rel=0.01)      # learned at width 3, not 0
    d = choose_k(shared, flat_acceptance(0.5), 4)
    assert d.k == 0
    c1 = d.candidates[1]       # its round t(3 + 1) and the row it adds to each of the 3 others' rounds
    delay = verify[4] - verify[3]
    assert c1.expected_ms == pytest.approx(verify[4] + 3 * delay + 0.5 + 1.0, rel=0.02)
    assert choose_k(shared, flat_acceptance(0.5, lookup=0.98), 4, ready=(True, True, True, True)).k >= 1
    fig = RoundFigures.from_outcome(Proposal(()), VerifyOutcome(0, 7, False, 5.0, 0.0, 4.0, 4), 6.0)
    assert (fig.forward_rows, fig.other_rows) == (4, 3)


def test_a_flat_curve_learned_under_load_leaves_draft_rows_their_cost():
    """8 clients on a 2-core host: forwards of ~19 rows, each verify learned at its whole width, and the
    costs of those forwards move with what rides along more than with their width, so the fit goes flat (the
    gateway's figures mid-run: 8.4 ms from width 2 to 8). Read off that fit, a block's rows delay nobody, and
    a drafter accepted at 0.5 looked worth it. The rise of k rows keeps the start-up profile's shape (a row
    ~10 % of a plain step here): the block is charged its rows for this round and for the 18 others', and the
    choice goes plain; alone, the same drafter still drafts."""
    profile = {w: 5.0 + 0.5 * w for w in range(9)}
    alone = cost_model(profile, draft_per_token=0.3, plain_oh=0.5)
    assert choose_k(alone, flat_acceptance(0.5), 4).k >= 1
    shared = cost_model(profile, draft_per_token=0.3, plain_oh=0.5)
    for _ in range(30):
        for k in (0, 2, 4):
            shared.observe(RoundFigures(width=k, accepted=0, verify_ms=8.4, draft_ms=0.3 * k, round_ms=8.9 + 0.3 * k,
                                        forward_rows=19 + k))
    assert shared.other_rows == 18
    assert shared.verify_ms(22) - shared.verify_ms(18) < 0.1                # the learned fit: flat
    d = choose_k(shared, flat_acceptance(0.5), 4)
    assert d.k == 0
    assert d.candidates[1].expected_ms > d.candidates[0].expected_ms + 18 * 0.5   # a row for each of the others


def test_a_drafter_on_the_verifiers_cores_pays_for_the_forward_it_slows():
    """On one box the drafter drafts while the verifier runs the other sessions' forward and takes a core from
    it: with 3 other sessions' rows, a drafted token's time counts for this round and for each of the 3 others
    (4x); alone, or with the drafter on its own cores, once. A drafter cheap alone (4 ms a token against a
    flat 20 ms verify, accepted at 0.6) pays on its own box but not on the shared one with company."""
    verify = {w: 20.0 + 0.2 * w for w in range(13)}

    def model(shared_cpus: bool, others: int) -> CostModel:
        cost = CostModel(shared_cpus=shared_cpus)
        cost.seed(verify)
        for _ in range(20):
            cost.observe(RoundFigures(width=0, accepted=0, verify_ms=verify[others], round_ms=verify[others] + 1.0,
                                      forward_rows=1 + others))
        cost.observe(RoundFigures(width=2, accepted=0, verify_ms=verify[2 + others], draft_ms=8.0,
                                  round_ms=verify[2 + others] + 8.0 + 1.0, forward_rows=3 + others))
        return cost

    acc = flat_acceptance(0.6)
    for others in (0, 3):
        apart, shared = choose_k(model(False, others), acc, 4), choose_k(model(True, others), acc, 4)
        extra = shared.candidates[2].expected_ms - apart.candidates[2].expected_ms
        assert extra == pytest.approx(others * 2 * 4.0, rel=0.05)      # 2 drafted tokens, 4 ms each, x others
        assert apart.k >= 1
    assert choose_k(model(True, 0), acc, 4).k >= 1
    assert choose_k(model(True, 3), acc, 4).k == 0
    # tokens already drafted or copied cost no drafter time, shared or not
    assert choose_k(model(True, 3), flat_acceptance(0.6, lookup=0.98), 4, ready=(True, True, True, True)).k >= 1


def test_a_copying_drafter_behind_a_slow_link_is_priced_as_the_drafter_it_is():
    """A model-free suffix node sends point masses the gateway's own lookup did not predict: each call costs
    its 20 ms wait, and a third of its copies are accepted. They are learned as drafter tokens (what the
    choice prices a block's unpredicted tokens at), so auto stops calling it; learned as lookup copies, the
    wait went unpriced and auto drafted every round at 4x a plain round's cost."""
    rng = random.Random(7)
    cost = CostModel()
    cost.seed({w: 5.0 + 0.2 * w for w in range(9)})
    policy = AutoDraftLength(cost, AcceptanceEstimator(default=0.5, prior=AcceptanceEstimator(alpha=0.02)))
    ks = []
    for _ in range(300):
        k = policy.next_k(8).k
        ks.append(k)
        if not k:
            policy.observe(RoundFigures(width=0, accepted=0, verify_ms=5.0, round_ms=5.5))
            continue
        n = 0
        while n < k and rng.random() < 0.3:
            n += 1
        policy.observe(RoundFigures(width=k, accepted=n, verify_ms=5.0 + 0.2 * k, draft_ms=21.0,
                                    round_ms=27.0 + 0.2 * k, from_lookup=(True,) * k))
    assert sum(1 for k in ks[50:] if k) < 0.1 * len(ks[50:]), ks
