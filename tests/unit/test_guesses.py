"""Guessed rows (drafter_service.guesses): the tokens a model drafter feeds after the one it drafted, guessed
from what followed the last tokens' most recent earlier occurrence, else from the drafter's habits (what it
most often drafted after the token). No torch here."""

from __future__ import annotations

from drafter_service.guesses import Continuations, Habits


def test_the_guess_is_what_followed_the_longest_most_recent_match():
    c = Continuations(max_ngram=3)
    #        0  1  2  3  4  5  6  7  8  9
    seq = [1, 2, 3, 9, 5, 2, 3, 7, 8, 2, 3]
    assert c.guess(seq, 2) == [7, 8]            # "2 3" last followed by 7 (position 7), not 9
    assert c.guess(seq + [7], 3) == [8, 2, 3]   # "2 3 7" -> 8 2 3
    assert c.guess([4, 5, 6], 2) == []          # a new sequence: no earlier 6
    assert c.guess([1], 2) == []


def test_the_sequences_own_tail_is_never_its_match():
    c = Continuations()
    assert c.guess([5, 6, 7], 1) == []
    assert c.guess([5, 5], 2) == [5]            # the earlier 5 is followed by the last one


def test_a_rewind_that_changes_the_tokens_never_guesses_from_them():
    c = Continuations(max_ngram=2)
    assert c.guess([1, 2, 3, 4, 2, 3], 1) == [4]
    # rewound to [1, 2] and continued differently: "2 3" now ends at the tail only, "3" is new
    assert c.guess([1, 2, 9, 2, 3], 1) == []    # the indexed "2 3" (end 3) pointed at tokens since changed
    assert c.guess([1, 2, 9, 2], 1) == [9]
    assert c.guess([1, 2, 9, 2, 9, 2], 2) == [9, 2]


def test_a_guess_says_how_long_a_match_it_stands_on():
    c = Continuations(max_ngram=3)
    line = [10, 11, 12, 13, 14, 15, 16, 17, 18]
    seq = [1, 2] + line + [3] + line[:8]        # the line again, up to its 8th token
    guesses, match = c.guess_matched(seq, 4)
    assert guesses == [18, 3, 10, 11] and match == 8     # the whole 8 tokens before recur (capped at 8)
    assert c.guess_matched(seq, 4, longest=5)[1] == 5
    guesses, match = c.guess_matched([7, 8, 9, 4, 8, 9], 2)
    assert guesses == [4, 8] and match == 2          # "8 9" recurs, "7 8 9" does not
    assert c.guess_matched([5, 6], 3) == ([], 0)


def brute_force(seq: list[int], m: int, max_ngram: int = 3) -> list[int]:
    size = len(seq)
    for n in range(min(max_ngram, size - 1), 0, -1):
        tail = seq[size - n:]
        for e in range(size - 1, n - 1, -1):
            if seq[e - n:e] == tail:
                return seq[e:e + m]
    return []


def test_guesses_equal_a_scan_of_the_whole_sequence_through_growth_and_rewinds():
    import random

    rng = random.Random(7)
    c = Continuations()
    seq: list[int] = [rng.randrange(6)]
    for step in range(600):
        if rng.random() < 0.15 and len(seq) > 3:                 # a rejection: rewind, maybe a new token
            seq = seq[:rng.randrange(1, len(seq))]
        seq.append(rng.randrange(6))
        m = rng.randrange(1, 4)
        assert c.guess(seq, m) == brute_force(seq, m), (step, seq)


def test_a_habit_is_the_most_frequent_follower_and_ties_keep_the_first():
    h = Habits()
    assert h.guess(5) == [] and len(h) == 0
    for a, b in [(5, 1), (5, 2), (5, 2), (5, 1)]:
        h.learn(a, b)
    assert h.guess(5) == [2]                    # 2 reached two first; 1's second count only ties it
    h.learn(5, 1)
    assert h.guess(5) == [1]
    assert h.learn_text([[1, 9, 1, 9], [9, 4]]) == 4
    assert h.guess(1) == [9] and h.guess(9) == [1]      # 9 -> 1 once, 9 -> 4 once: the first stays
    assert h.guess(5, 4) == [1, 9, 1, 9]         # a chain of habits


def test_habits_count_a_bounded_number_of_followers():
    """At most ``successors`` followers a token: a newcomer replaces the least counted, taking over its count
    plus one, so a token that keeps coming back becomes the habit and the memory stays bounded."""
    h = Habits(successors=2)
    for b in (1, 1, 1, 2, 3, 3, 3):
        h.learn(7, b)
    assert h._next[7] == {1: 3, 3: 4}           # 3 replaced 2 (count 1 + 1), then counted twice more
    assert h.guess(7) == [3]
