"""Guessed rows: a model drafter's own speculation, so one forward can draft more than one token.

On a CPU a drafter's one-token step reads every weight once and is bound by memory bandwidth: the target's
own file with int8 activations takes ~5.3 ms a row on one Zen 4 core and ~5.7 ms for two rows (BENCHMARKS.md,
thirtieth session). So when the drafter feeds the token it just drafted, it may feed after it the tokens it
guesses will follow (what followed the most recent earlier occurrence of the last few tokens, as prompt
lookup finds them) for little more. Where its next drafted token is the guess, the guess's row already holds
the logits after it and the step is skipped; where not, the rows after the first differing token are
dropped from the KV (a crop) and nothing else changes.

Where the session's text has no earlier occurrence of the last token (about 30 % of a chat answer's positions),
the guess is the drafter's habit (``Habits``): the token it has itself most often drafted after that one,
over every session it served and, from the start, over text its target wrote (the shipped drafter's answers
to its training questions, where the vocabulary is the default target's). On 65 held-out Spec-Bench answers of
the default target's .gguf node, a guess was right at 36 % of positions without habits and 43 % with them
(BENCHMARKS.md, thirty-third session).

Where the text loops (the last ``LONG_MATCH`` tokens recur earlier in the session, as a long answer of a small
target often does), the next tokens are very likely what followed them then, and the drafter guesses a chain
of ``long_guesses`` tokens instead of one: one wider forward then drafts up to that many tokens more. Over the
default target's .gguf node's own 1 024-token answers to the 13 bench prompts, 8 recurring tokens -> 7 guesses
took 1.70 -> 3.0 tokens a forward and ~20 % less time a drafted token (the int8 step's measured costs by
width); over their first 128 tokens, where little recurs, 1.28 -> 1.38 (BENCHMARKS.md, thirty-fifth session).

The drafted tokens do not depend on the guesses: each is still chosen from the drafter's own logits row for
the real draft prefix (a guess is used only when it *is* the token chosen), so the block and the q it reports
are what one-token steps would give, with rows that are bit-identical at every width (the verifier's decoder
keeps them so). Guesses change the drafter's speed only.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import numpy as np

MAX_NGRAM = 3
LONG_MATCH = 8          # the last this many tokens recurred: the text loops, guess a chain (module docstring)


def common_prefix(a: Sequence[int], b: Sequence[int], n: int | None = None) -> int:
    """Length of the common prefix of a[:n] and b[:n] (n: the shorter length when None), in one numpy pass."""
    n = min(len(a), len(b)) if n is None else n
    if n <= 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if diff.size else n


class Continuations:
    """What followed the most recent earlier occurrence of a sequence's last n tokens (n = ``max_ngram`` down
    to 1), over a sequence that grows and rewinds (a drafter session's tokens). Each n-gram occurrence is
    indexed once, by its end; a rewind un-indexes the occurrences ending past the tokens kept (newest first,
    so every n-gram's list of ends stays in order and its last entry is its most recent occurrence)."""

    def __init__(self, max_ngram: int = MAX_NGRAM):
        self.max_ngram = max(1, int(max_ngram))
        self._ends: dict[tuple[int, ...], list[int]] = {}
        self._log: list[tuple[int, tuple[int, ...]]] = []    # (end, n-gram) in the order indexed
        self._seq: list[int] = []
        self._indexed = 1                                    # occurrences ending before this are indexed

    def guess(self, seq: Sequence[int], m: int) -> list[int]:
        """Up to ``m`` tokens guessed to follow ``seq`` (empty: no earlier occurrence of its last token)."""
        return self.guess_matched(seq, m)[0]

    def guess_matched(self, seq: Sequence[int], m: int, longest: int = LONG_MATCH) -> tuple[list[int], int]:
        """``guess(seq, m)`` and how many of seq's last tokens (at most ``longest``) the occurrence it copies
        from follows too: how much the guess stands on."""
        if m <= 0 or len(seq) < 2:
            return [], 0
        size = len(seq)
        done = min(common_prefix(self._seq, seq), size - 1)  # occurrences ending at size are the query itself
        log, ends, hi = self._log, self._ends, self.max_ngram
        while log and log[-1][0] > done:                     # its tokens changed or are gone
            ends[log.pop()[1]].pop()
        for e in range(max(1, min(self._indexed, done + 1)), size):
            for n in range(1, min(hi, e) + 1):
                key = tuple(seq[e - n:e])
                ends.setdefault(key, []).append(e)
                log.append((e, key))
        self._indexed, self._seq = size, list(seq)
        for n in range(min(hi, size - 1), 0, -1):
            found = ends.get(tuple(seq[size - n:]))
            if found:
                end = found[-1]
                match = n
                while match < longest and end - match > 0 and seq[end - match - 1] == seq[size - match - 1]:
                    match += 1
                return [int(t) for t in seq[end:end + m]], match
        return [], 0


class Habits:
    """What the drafter itself drafted after each token: ``guess(token)`` is the token that most often followed
    it in what ``learn`` was shown (the drafter's own drafted tokens, all sessions) and ``learn_text`` read
    (text its target wrote). Bounded: at most ``successors`` followers a token are counted, the least counted
    replaced by a newcomer (its count carried over, so a newcomer needs to overtake it); one lock, as several
    sessions draft on their own threads. Only the drafter's speed depends on it: a guess is a row fed beside a
    drafted token, never a drafted token."""

    def __init__(self, successors: int = 8):
        self.successors = max(1, int(successors))
        self._next: dict[int, dict[int, int]] = {}
        self._best: dict[int, int] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._next)

    def learn(self, token: int, following: int) -> None:
        """``following`` came after ``token``."""
        with self._lock:
            self._count(int(token), int(following))

    def learn_text(self, sequences: Iterable[Sequence[int]]) -> int:
        """Every pair of neighbours in ``sequences``; returns the pairs read."""
        pairs = 0
        with self._lock:
            for seq in sequences:
                for a, b in zip(seq, seq[1:]):
                    self._count(int(a), int(b))
                pairs += max(0, len(seq) - 1)
        return pairs

    def _count(self, a: int, b: int) -> None:
        counts = self._next.setdefault(a, {})
        if b in counts:
            counts[b] += 1
        elif len(counts) < self.successors:
            counts[b] = 1
        else:                                        # replace the least counted, its count carried over + 1
            low = min(counts, key=counts.__getitem__)
            counts[b] = counts.pop(low) + 1
        best = self._best.get(a)
        if best is None or best not in counts or counts[b] > counts[best]:
            self._best[a] = b

    def guess(self, token: int, m: int = 1) -> list[int]:
        """Up to ``m`` tokens: the habit after ``token``, then the habit after that one, ... (empty: none)."""
        out: list[int] = []
        t = int(token)
        while len(out) < m:
            t = self._best.get(t)
            if t is None:
                break
            out.append(t)
        return out


class GuessCounts:
    """Rows a drafter fed as guesses, and those whose guess was the next token it drafted (each a forward saved),
    by where the guess came from: ``session`` (the session's own text, ``Continuations``) or ``habit``
    (``Habits``). Read by the drafter's metrics (``tandem:drafter_guessed_rows``)."""

    SOURCES = ("session", "habit")

    def __init__(self):
        self.fed = dict.fromkeys(self.SOURCES, 0)
        self.used = dict.fromkeys(self.SOURCES, 0)
