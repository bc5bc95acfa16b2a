"""Prompt lookup: free draft tokens copied from the context, with q reported as a point mass."""

import numpy as np

from drafter_service.lookup import checked_length
from drafter_service.onnx_drafter import OnnxDrafter
from tandem.lookup import find_lookup
from tandem.types import SamplingParams


def prompt_lookup(context, k, max_ngram=4, min_ngram=2):
    """The rule's tokens alone."""
    return find_lookup(context, k, max_ngram, min_ngram)[0]


def test_longest_recurring_ngram_wins_and_most_recent_occurrence_is_used():
    ctx = [1, 2, 3, 9, 9, 5, 2, 3, 7, 8, 1, 2, 3]
    # last 3-gram (1 2 3) recurs at 0 -> continuation 9 9 5 ; 2-gram (2 3) most recently at 6 -> 7 8
    assert prompt_lookup(ctx, 3, max_ngram=3, min_ngram=2) == [9, 9, 5]
    assert prompt_lookup(ctx, 2, max_ngram=2, min_ngram=2) == [7, 8]


def test_no_recurrence_gives_nothing():
    assert prompt_lookup([1, 2, 3, 4, 5], 4) == []
    assert prompt_lookup([7], 4) == []


def test_continuation_is_cut_at_the_context_end():
    assert prompt_lookup([5, 6, 5, 6], 4, max_ngram=2, min_ngram=2) == [5, 6]


def test_checked_length_keeps_tokens_until_a_confident_disagreement():
    looked = [5, 6, 7, 8]
    assert checked_length(looked, [5, 6, 7, 8], [0.9] * 4, 0.5) == 4          # the drafter agrees
    assert checked_length(looked, [5, 9, 7, 8], [0.9, 0.4, 0.9, 0.9], 0.5) == 4   # disagrees, but unsure
    assert checked_length(looked, [5, 6, 9, 8], [0.9, 0.9, 0.5, 0.9], 0.5) == 2   # sure (>= confidence): cut
    assert checked_length(looked, [1, 2, 3, 4], [0.0] * 4, 0.0) == 0          # confidence 0: any disagreement
    assert checked_length([], [], [], 0.5) == 0


def test_drafter_mixes_lookup_and_model_tokens(tiny_drafter_onnx):
    plain = OnnxDrafter(tiny_drafter_onnx, threads=1)
    hybrid = OnnxDrafter(tiny_drafter_onnx, threads=1, lookup_max_ngram=3, lookup_min_ngram=2)
    ctx = [1, 10, 11, 12, 13, 20, 10, 11]   # "10 11" recurs: lookup proposes what followed, 12 13 20 10 11
    greedy = hybrid.propose("g", 0, ctx, 7, SamplingParams())
    looked = [12, 13, 20, 10, 11]
    assert greedy.token_ids[:5] == looked
    # the last two come from the model, continuing after the looked-up tokens
    model_cont = plain.propose("p", 0, ctx + looked, 2, SamplingParams())
    assert greedy.token_ids[5:] == model_cont.token_ids

    sampled = hybrid.propose("s", 0, ctx, 7, SamplingParams(temperature=1.0))      # rejection sampling: q sent
    for tok in sampled.tokens[:5]:
        assert tok.support_ids == (tok.token_id,) and tok.support_probs == (1.0,)   # q = point mass
    for tok in sampled.tokens[5:]:
        assert len(tok.support_ids) > 1 and abs(sum(tok.support_probs) - 1) < 1e-4
    coupled = hybrid.propose("c", 0, ctx, 7, SamplingParams(temperature=1.0, seed=3))
    assert coupled.token_ids[:5] == looked and all(not t.support_ids for t in coupled.tokens)  # q is never read
    # a proposal made entirely by lookup needs no model run, and the next one still syncs correctly
    full = hybrid.propose("g", len(ctx), [12, 13], 2, SamplingParams())     # "11 12 13" recurs
    assert full.token_ids == [20, 10]
    after = hybrid.propose("g", len(ctx) + 2, [99 % 64], 3, SamplingParams())
    fresh = OnnxDrafter(tiny_drafter_onnx, threads=1, lookup_max_ngram=3).propose(
        "f", 0, ctx + [12, 13, 99 % 64], 3, SamplingParams())
    assert after.token_ids == fresh.token_ids
    assert np.all(np.asarray(after.token_ids) < 64)


def test_the_gateway_s_incremental_index_finds_what_find_lookup_finds():
    """LookupIndex (the gateway's, fed a sequence that grows every round) answers exactly as find_lookup
    over the whole sequence, for every rule bound, block length and growth step; a sequence that is not an
    extension is re-indexed."""
    from tandem.lookup import LookupIndex, find_lookup
    rng = np.random.default_rng(7)
    for max_ngram, min_ngram in ((4, 1), (4, 2), (3, 3), (1, 1)):
        for trial in range(8):
            vocab = int(rng.integers(2, 12))
            seq = rng.integers(0, vocab, size=int(rng.integers(1, 20))).tolist()
            index = LookupIndex(max_ngram, min_ngram)
            while len(seq) < 300:
                k = int(rng.integers(1, 9))
                assert index.find(seq, k) == find_lookup(seq, k, max_ngram, min_ngram), (seq, k)
                seq = seq + rng.integers(0, vocab, size=int(rng.integers(1, 6))).tolist()
            other = seq[:50] + [vocab + 1] + seq[51:120]            # a different sequence: re-indexed
            assert index.find(other, 4) == find_lookup(other, 4, max_ngram, min_ngram)
            assert index.find(seq[:30], 4) == find_lookup(seq[:30], 4, max_ngram, min_ngram)
