"""The acceptance rule on hand-built p (target_probs) and q (draft_probs) tables."""

import torch

from verifier_service.acceptance import accept_greedy, accept_random


def gen(seed=0):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def test_greedy_accepts_matching_prefix_and_emits_recovered_token():
    # argmax per position: 3, 1, 2 ; draft 3, 0 -> first accepted, second rejected, recovered = 1
    logits = torch.tensor([[0., 0, 0, 5], [0, 5, 0, 0], [0, 0, 5, 0]])
    out = accept_greedy(logits, [3, 0])
    assert (out.accepted, out.next_token, out.bonus) == (1, 1, False)


def test_greedy_all_accepted_emits_bonus_token():
    logits = torch.tensor([[0., 0, 0, 5], [0, 5, 0, 0], [0, 0, 5, 0]])
    out = accept_greedy(logits, [3, 1])
    assert (out.accepted, out.next_token, out.bonus) == (2, 2, True)


def test_greedy_empty_block_is_plain_decoding():
    out = accept_greedy(torch.tensor([[0., 7, 0, 0]]), [])
    assert (out.accepted, out.next_token, out.bonus) == (0, 1, False)


def test_random_accepts_when_target_gives_at_least_the_draft_probability():
    # p(x) >= q(x) at every position -> min(1, p/q) = 1: always accepted, bonus from p_3
    p = torch.tensor([[0.1, 0.9, 0.0, 0.0], [0.0, 0.0, 0.6, 0.4], [0.0, 0.0, 0.0, 1.0]])
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5]])
    for seed in range(50):
        out = accept_random(p, [1, 2], q, gen(seed))
        assert (out.accepted, out.next_token, out.bonus) == (2, 3, True)


def test_random_rejects_token_the_target_never_emits_and_recovers_from_residual():
    # p(x_1) = 0 -> always rejected at position 0; residual max(p - q, 0) = [0, 0, 0.5, 0] -> token 2
    p = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    for seed in range(50):
        out = accept_random(p, [0], q, gen(seed))
        assert (out.accepted, out.next_token, out.bonus) == (0, 2, False)


def test_random_acceptance_frequency_is_p_over_q():
    # p(x) = 0.3, q(x) = 0.6 -> accepted with probability 0.5; recovered only from {1}
    p = torch.tensor([[0.3, 0.7], [0.5, 0.5]])
    q = torch.tensor([[0.6, 0.4]])
    g = gen(1)
    outcomes = [accept_random(p, [0], q, g) for _ in range(4000)]
    rate = sum(o.accepted for o in outcomes) / len(outcomes)
    assert abs(rate - 0.5) < 0.04            # 5 sigma of a binomial(4000, 0.5) is 0.04
    assert all(o.next_token == 1 for o in outcomes if o.accepted == 0)
