"""drafter_service.sampling against a straightforward reference (sort everything, loop)."""

from __future__ import annotations

import numpy as np
import pytest

from drafter_service.sampling import sample_index, session_rng, truncate_support, warp
from tandem.types import SamplingParams


def reference_warp(logits, temperature, top_k=0, top_p=1.0):
    x = [float(v) / temperature for v in logits]
    n = len(x)
    if 0 < top_k < n:
        kth = sorted(x, reverse=True)[top_k - 1]
        x = [v if v >= kth else float("-inf") for v in x]
    m = max(x)
    e = [np.exp(v - m) for v in x]
    z = sum(e)
    p = [v / z for v in e]
    if top_p < 1.0:
        order = sorted(range(n), key=lambda i: (-p[i], i))
        keep, mass = set(), 0.0
        for i in order:
            if mass < top_p or not keep:
                keep.add(i)
            mass += p[i]
        p = [v if i in keep else 0.0 for i, v in enumerate(p)]
        z = sum(p)
        p = [v / z for v in p]
    return np.array(p)


@pytest.mark.parametrize("vocab", [8, 64, 5000])
@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.9), (0.8, 10, 0.5), (1.0, 1, 1.0),
    (1.0, 0, 1e-6), (2.0, 3, 0.99), (1.0, 10_000, 1.0), (1.0, 0, 0.999),
])
def test_warp_matches_reference(vocab, temperature, top_k, top_p):
    rng = np.random.default_rng(vocab * 7 + top_k)
    logits = rng.normal(0, 3, vocab).astype(np.float32)
    got = warp(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    want = reference_warp(logits, temperature, top_k, top_p)
    assert got.shape == (vocab,)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    assert np.count_nonzero(got) == np.count_nonzero(want)
    assert got.sum() == pytest.approx(1.0)


def test_top_p_boundary_keeps_smallest_set_reaching_it():
    logits = np.log(np.array([0.5, 0.25, 0.125, 0.125]))
    # exclusive cumulative masses 0, .5, .75, .875: top_p .75 keeps the first two (0.5 + 0.25 reaches .75)
    p = warp(logits, SamplingParams(temperature=1.0, top_p=0.75))
    np.testing.assert_allclose(p, [2 / 3, 1 / 3, 0, 0], rtol=1e-12)
    p = warp(logits, SamplingParams(temperature=1.0, top_p=0.76))
    np.testing.assert_allclose(p, [4 / 7, 2 / 7, 1 / 7, 0], rtol=1e-12)
    # tiny top_p still keeps one token
    p = warp(logits, SamplingParams(temperature=1.0, top_p=1e-9))
    np.testing.assert_array_equal(p, [1, 0, 0, 0])


def test_top_k_ties_are_kept_and_top_k_larger_than_vocab_is_off():
    logits = np.array([3.0, 1.0, 3.0, 2.0, 2.0])
    p = warp(logits, SamplingParams(temperature=1.0, top_k=3))
    assert np.count_nonzero(p) == 4  # the 3rd largest (2.0) is tied: both kept
    assert p[1] == 0
    np.testing.assert_allclose(warp(logits, SamplingParams(temperature=1.0, top_k=99)),
                               reference_warp(logits, 1.0), rtol=1e-12)


def test_top_p_large_vocab_falls_back_to_full_sort_when_candidates_do_not_reach_it():
    logits = np.zeros(10_000, dtype=np.float32)  # flat: the top 1024 hold ~10 % of the mass
    logits[:3] = [0.5, 0.4, 0.3]
    got = warp(logits, SamplingParams(temperature=1.0, top_p=0.95))
    np.testing.assert_allclose(got, reference_warp(logits, 1.0, 0, 0.95), rtol=1e-9, atol=1e-15)
    assert 9000 < np.count_nonzero(got) < 10_000


def test_greedy_warp_is_one_hot_argmax():
    p = warp(np.array([0.1, 5.0, 5.0, -1.0]), SamplingParams())
    np.testing.assert_array_equal(p, [0, 1, 0, 0])


def test_warp_rejects_bad_shapes():
    with pytest.raises(ValueError):
        warp(np.zeros((2, 3)), SamplingParams(temperature=1.0))


def test_truncate_support():
    probs = np.array([0.05, 0.4, 0.0, 0.3, 0.25])
    ids, q = truncate_support(probs, 2)
    assert ids.tolist() == [1, 3]
    assert q.dtype == np.float32
    np.testing.assert_allclose(q, [0.4 / 0.7, 0.3 / 0.7], rtol=1e-6)
    ids, q = truncate_support(probs, 10)  # never includes zero-probability tokens
    assert ids.tolist() == [1, 3, 4, 0]
    assert float(q.sum()) == pytest.approx(1.0, abs=1e-6)
    ids, _ = truncate_support(probs, 0)  # 0 = full support
    assert ids.tolist() == [1, 3, 4, 0]
    with pytest.raises(ValueError):
        truncate_support(np.zeros(3), 2)


def test_sample_index_follows_probs_and_never_picks_zero():
    rng = np.random.default_rng(0)
    probs = np.array([0.5, 0.0, 0.3, 0.2, 0.0], dtype=np.float32)
    n = 20_000
    counts = np.bincount([sample_index(probs, rng) for _ in range(n)], minlength=5)
    assert counts[1] == 0 and counts[4] == 0
    np.testing.assert_allclose(counts / n, probs, atol=0.015)


def test_session_rng_is_seeded_on_its_own_stream():
    a = session_rng(123).random(4)
    b = session_rng(123).random(4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, np.random.default_rng(123).random(4))
    assert not np.array_equal(session_rng(None).random(4), session_rng(None).random(4))


def test_coupled_draft_is_the_argmax_of_scaled_logits_plus_the_shared_noise():
    """Over its reported support, mapped to target ids, leaving out tokens whose q is below the checks' floor."""
    from drafter_service.sampling import coupled_draft
    from tandem.coupling import gumbel

    rng = np.random.default_rng(4)
    logits = rng.normal(0, 2, 40).astype(np.float32)
    sampling = SamplingParams(temperature=0.7, top_p=0.9, seed=12)
    ids, probs = truncate_support(warp(logits, sampling), 16)
    draft_vocab = np.arange(40)[::-1] + 100                       # logit index -> target id
    for position in range(50):
        choice = coupled_draft(logits, ids, probs, sampling, position, draft_vocab)
        scores = logits[ids].astype(np.float64) / 0.7 + gumbel(12, position, draft_vocab[ids])
        scores[probs < 1e-6] = -np.inf
        assert choice == int(np.argmax(scores))


def test_a_drafter_with_the_targets_logits_drafts_the_targets_own_sample():
    """Same logits, same noise: the coupled draft is the verifier's coupled sample (acceptance 1)."""
    import torch

    from drafter_service.sampling import coupled_draft
    from verifier_service.acceptance import coupled_sample

    rng = np.random.default_rng(5)
    for seed in range(200):
        logits = rng.normal(0, 3, 300).astype(np.float32)
        sampling = SamplingParams(temperature=0.8, top_k=50, seed=seed)
        ids, probs = truncate_support(warp(logits, sampling), 0)
        drafted = int(ids[coupled_draft(logits, ids, probs, sampling, 33)])
        assert drafted == coupled_sample(torch.from_numpy(logits), sampling, 33)
