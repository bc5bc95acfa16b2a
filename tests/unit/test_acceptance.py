"""The acceptance rule on hand-built p (target_probs) and q (draft_probs) tables."""

import numpy as np
import pytest
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


# ---- the coupled rule (seeded sessions) --------------------------------------------------------------------
from tandem.coupling import coupled_index, gumbel, position_key, uniform_bits  # noqa: E402
from tandem.types import SamplingParams  # noqa: E402
from verifier_service.acceptance import accept_coupled, coupled_sample  # noqa: E402
from verifier_service.warping import warp  # noqa: E402

COUPLED = SamplingParams(temperature=0.9, top_k=3, seed=11)


def test_coupled_block_keeps_the_drafts_equal_to_the_targets_samples():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 16, generator=g) * 2                          # [k+1, V], k = 3, first position 20
    samples = [coupled_sample(logits[i], COUPLED, 20 + i) for i in range(4)]
    out = accept_coupled(logits, samples[:3], COUPLED, 20)                 # every draft is the target's sample
    assert (out.accepted, out.next_token, out.bonus) == (3, samples[3], True)
    wrong = (samples[1] + 1) % 16
    out = accept_coupled(logits, [samples[0], wrong, samples[2]], COUPLED, 20)
    assert (out.accepted, out.next_token, out.bonus) == (1, samples[1], False)   # the recovered token: its sample
    out = accept_coupled(logits[:1], [], COUPLED, 20)                      # an empty block is a plain step
    assert (out.accepted, out.next_token, out.bonus) == (0, samples[0], False)


def test_coupled_sample_follows_p_and_never_emits_a_token_outside_the_support():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 3.0])
    p = warp(logits.unsqueeze(0), SamplingParams(temperature=0.9, top_k=3))[0]
    n = 10_000
    counts = torch.bincount(torch.tensor([coupled_sample(logits, SamplingParams(temperature=0.9, top_k=3, seed=s), 7)
                                          for s in range(n)]), minlength=6)
    assert counts[p == 0].sum() == 0
    assert torch.allclose(counts / n, p, atol=0.02)                       # 4 sigma of a binomial(10000, 0.5)
    # a draft of a token outside the support is never accepted, whatever the seed
    for s in range(200):
        out = accept_coupled(logits.repeat(2, 1), [4], SamplingParams(temperature=0.9, top_k=3, seed=s), 7)
        assert out.accepted == 0 and p[out.next_token] > 0


def test_the_noise_is_a_pure_function_of_seed_position_and_token():
    ids = np.array([0, 1, 5, 49_151])
    g = gumbel(7, 3, ids)
    np.testing.assert_array_equal(g, gumbel(7, 3, ids))
    np.testing.assert_array_equal(g[2:3], gumbel(7, 3, [5]))                # a token's noise, alone or with others
    assert not np.array_equal(g, gumbel(8, 3, ids)) and not np.array_equal(g, gumbel(7, 4, ids))
    # integer hashing (the same bits on every machine): SplitMix64 written out in Python integers
    assert uniform_bits(position_key(7, 3), ids).tolist() == [splitmix_bits(7, 3, int(v)) for v in ids]
    assert uniform_bits(position_key(2**64 - 1, 10**6), ids).tolist() == \
        [splitmix_bits(2**64 - 1, 10**6, int(v)) for v in ids]
    with pytest.raises(ValueError, match="seed"):
        position_key(2**64, 0)


def splitmix_bits(seed: int, position: int, token: int) -> int:
    """tandem.coupling's 53 bits of (seed, position, token), computed on Python integers."""
    mask, golden = 2**64 - 1, 0x9E3779B97F4A7C15

    def mix(x):
        x &= mask
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        return x ^ (x >> 31)

    key = mix(mix(seed ^ 0x636F75706C656421) + (position + 1) * golden)
    return mix(key + (token + 1) * golden) >> 11


@pytest.mark.parametrize("scale", [0.5, 3.0, 20.0])
def test_coupled_index_over_a_large_support_is_the_argmax_over_every_token(scale):
    rng = np.random.default_rng(int(scale))
    ids = np.arange(49_152)
    for position in range(30):
        scores = rng.normal(0, scale, ids.shape[0])
        full = int(np.argmax(scores + gumbel(5, position, ids)))
        assert coupled_index(scores, ids, 5, position) == full


def test_coupled_choice_over_a_raw_row_is_the_argmax_over_every_token_with_either_scan():
    """The verifier's coupled sample over a whole row scans it once for the tokens that can win (numpy, or the
    C kernel): the same token as the noise added to every token, ties at the top and masked tokens included."""
    from tandem.coupling import candidates, coupled_choice
    from verifier_service import native

    scans = [candidates] + ([native.library().coupled_candidates] if native.library() is not None else [])
    rng = np.random.default_rng(11)
    for vocab in (3000, 49_152, 262_144):
        ids = np.arange(vocab)
        for trial in range(12):
            logits = (rng.normal(0, rng.uniform(0.5, 8.0), vocab)).astype(np.float32)
            if trial % 3 == 0:
                logits[rng.integers(vocab, size=40)] = logits.max()            # ties at the top
            if trial % 4 == 1:
                logits[rng.integers(vocab, size=vocab // 3)] = -np.inf         # masked tokens
            temperature = float(rng.choice([0.2, 0.7, 1.0, 1.7]))
            seed, position = int(rng.integers(2**64, dtype=np.uint64)), int(rng.integers(100_000))
            scores = logits.astype(np.float64) / temperature
            with np.errstate(invalid="ignore"):
                want = int(np.argmax(scores + gumbel(seed, position, ids)))
            for scan in scans:
                assert coupled_choice(logits, temperature, seed, position, scan) == want, (vocab, trial, scan)


def test_a_verify_block_is_warped_row_by_row_like_plain_steps():
    g = torch.Generator().manual_seed(3)
    for vocab, scale in ((64, 1.0), (5000, 4.0), (49_152, 6.0)):
        logits = torch.randn(6, vocab, generator=g) * scale
        logits[:, 10] = logits[:, 3]                                       # ties
        for params in (SamplingParams(temperature=0.8, top_p=0.95), SamplingParams(temperature=1.3, top_k=20, top_p=0.5),
                       SamplingParams(temperature=0.7, top_p=0.999)):
            block = warp(logits, params)
            for i in range(6):
                assert torch.equal(block[i], warp(logits[i:i + 1], params)[0])


def reference_top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Kept mask by a full sort (probability descending, lower id first), each token kept while the mass before
    it is below top_p."""
    order = sorted(range(probs.shape[0]), key=lambda i: (-float(probs[i]), i))
    keep, mass = torch.zeros(probs.shape[0], dtype=torch.bool), 0.0
    for i in order:
        if mass < top_p:
            keep[i] = True
        mass += float(probs[i])
    return keep


@pytest.mark.parametrize("scale", [0.3, 2.0, 8.0])
def test_top_p_keeps_what_a_full_sort_keeps(scale):
    g = torch.Generator().manual_seed(int(scale * 10))
    for top_p in (0.5, 0.9, 0.95):
        logits = torch.randn(2, 8000, generator=g) * scale              # flat (full sort) to peaked (floors)
        probs = torch.softmax(logits, dim=-1)
        got = warp(logits, SamplingParams(temperature=1.0, top_p=top_p)) > 0
        for i in range(2):
            assert torch.equal(got[i], reference_top_p(probs[i], top_p))
