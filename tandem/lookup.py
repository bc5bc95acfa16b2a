"""Prompt lookup: free draft tokens copied from the context (Saxena 2023, "prompt lookup decoding").

The rule: for n = max_ngram down to min_ngram, if the context's last n tokens occurred earlier in it, the
proposal is the (up to k) tokens that followed their most recent earlier occurrence, found by the longest
such n (a quote, a name, code, a summary, the repetition small models fall into); else nothing. It is a
deterministic function of the context, so the distribution a proposed token was drawn from is a point
mass, q = δ(x): reporting exactly that keeps verification exact (the verifier accepts x with probability
p(x) and otherwise samples from p without x).

Two algorithms give the rule's answers: ``find_lookup`` scans the context (numpy; the drafter's, whose
contexts grow and rewind), ``LookupIndex`` keeps an index of the n-grams of a context that only grows (the
gateway's, round after round); tests/unit/test_lookup.py holds them equal. The drafter may check short
matches against its model (``drafter_service.lookup``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tandem.types import DraftToken, SamplingParams


def lookup_proposal(ids: Sequence[int], sampling: SamplingParams) -> list[DraftToken]:
    """Lookup tokens as draft tokens: q is a point mass on each (greedy: no q at all). Whoever copies them
    (the drafter, or the gateway for a block lookup supplies whole) proposes the same tokens with the same q."""
    if not sampling.needs_draft_probs:
        return [DraftToken(int(t), from_lookup=True) for t in ids]
    return [DraftToken(int(t), (int(t),), (1.0,), from_lookup=True) for t in ids]


def find_lookup(context: Sequence[int], k: int, max_ngram: int = 4, min_ngram: int = 2) -> tuple[list[int], int]:
    """The rule's tokens (the module docstring) and the length n of the n-gram they were found by (0: none).

    A long match (a quote, a name, a repeated line) is usually right; a match on the last token alone
    often is not, which is why the drafter checks short matches against its model (LookupDrafter).
    """
    ctx = np.asarray(context, dtype=np.int64)
    size = len(ctx)
    for n in range(min(max_ngram, size - 1), min_ngram - 1, -1):
        tail = ctx[size - n:]
        # windows starting at 0 .. size-n-1 (the tail itself excluded)
        starts = np.flatnonzero(ctx[: size - n] == tail[0])
        for s in starts[::-1]:                       # most recent occurrence first
            if s + n < size and np.array_equal(ctx[s:s + n], tail):
                return ctx[s + n: s + n + k].tolist(), n
    return [], 0


class LookupIndex:
    """``find_lookup`` over a sequence that only grows (the gateway's, round after round), at a cost per
    call that does not grow with it: every n-gram (n = min_ngram .. max_ngram) is indexed once, by the end
    of its most recent occurrence. Same answers as ``find_lookup`` (tests/unit/test_lookup.py). A context
    that is not an extension of the last one (shorter, or its last indexed tokens differ) is re-indexed."""

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2):
        self.max_ngram, self.min_ngram = int(max_ngram), max(1, int(min_ngram))
        self._end: dict[tuple[int, ...], int] = {}   # n-gram -> end (exclusive) of its latest indexed occurrence
        self._done = 0                               # length of the context last seen
        self._tail: list[int] = []                   # its last max_ngram tokens

    def find(self, context: Sequence[int], k: int) -> tuple[list[int], int]:
        size, done, hi, lo = len(context), self._done, self.max_ngram, self.min_ngram
        if done > size or list(context[max(0, done - hi):done]) != self._tail:
            self._end.clear()
            done = 0
        # n-grams ending at e = done .. size-1; the context's own tail (ending at size) is not an earlier occurrence
        for e in range(max(done, 1), size):
            for n in range(lo, min(hi, e) + 1):
                self._end[tuple(context[e - n:e])] = e
        self._done, self._tail = size, list(context[max(0, size - hi):size])
        for n in range(min(hi, size - 1), lo - 1, -1):
            e = self._end.get(tuple(context[size - n:]))
            if e is not None:
                return list(context[e:e + k]), n
        return [], 0
