"""Suffix drafting's statistics: what followed the context's longest recurring suffix, and how often
(SuffixDecoding, Oliaro et al. 2025; vLLM's ``method="suffix"``).

A ``SuffixIndex`` holds token sequences (each session's prompt + accepted output, and, kept after the
session ends, the text of past sessions) and answers ``propose(context, max_tokens)``: the most frequent
continuation of the longest suffix of ``context`` that occurred in them, as long as its estimated
acceptance stays high enough. Its answers are those of a depth-bounded suffix tree over the sequences
(node count = occurrences of a string, child count / node count = how often a token followed it),
computed from an occurrence index instead of materialised tree nodes, which in Python would cost
kilobytes per stored token:

* every position of every sequence is indexed under the n-grams ending there, for n in ``orders``
  (1, 2, 4, 8): the key is the n-gram's hash, the value its occurrences, newest last (the most recent
  ``recent`` of them are read, at most ``4 * recent`` kept per key);
* a query takes the longest order whose n-gram of the context's tail occurred, reads those occurrences
  (newest first), measures each one's match length (the common suffix of the context and the text
  before it, up to ``max_match``; a binary search on slices, since a suffix of a match is a match) and
  its continuation;
* for each match length L found (longest first), the candidates matching at least L tokens form the
  tree node of the context's last L tokens; a path is grown greedily by the most frequent next token
  (ties: the most recent), its probability being the product of count(child) / count(node), and it
  stops before the probability falls below ``min_prob`` or at ``factor * L + offset`` tokens (a short
  match is weak evidence). The score is the path's expected accepted tokens (the sum of the prefix
  probabilities); the best-scored path over all L is proposed (ties: the longer match). A candidate
  whose text ends (an in-flight sequence) counts in the node's count and continues nowhere, as a
  suffix ending at a tree node does.

Costs: indexing a token is one tuple hash and one dict update per order (O(length) updates); a query is
a few dict reads plus O(candidates x (log max_match + path length)) slice operations, independent of
how much text is held (measured in tests/unit/test_suffix.py). Memory: ``max_tokens`` bounds the text
held (a token budget; about 350 bytes a token with the default orders, index included): once over it,
the least recently used released sequence is evicted whole (used = released, written to, or proposed
from), its index entries removed. Sequences still open (in-flight sessions) are never evicted, so they
alone can hold the index above the budget; they are bounded by the sessions a drafter holds.

Thread-safe (one lock per index). Plain Python, no numpy: per query the work is a few dozen slice
comparisons, below numpy's per-call overhead.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

ORDERS = (1, 2, 4, 8)           # n-gram lengths positions are indexed under
MAX_MATCH = 32                  # the longest match length measured (a tree of depth MAX_MATCH + path)
RECENT = 64                     # occurrences read per query (the newest)
MIN_PROB = 0.1                  # a path stops before its probability falls below this
MAX_SPEC_FACTOR = 1.0           # a path is at most factor * match length + offset tokens
MAX_SPEC_OFFSET = 0.0
DEFAULT_MEMORY_TOKENS = 1_000_000
_SHIFT = 32                     # an occurrence is packed as sequence number << 32 | end position
_MASK = (1 << _SHIFT) - 1


@dataclass(frozen=True)
class SuffixDraft:
    """A proposed continuation: ``tokens`` (may be empty), ``score`` = expected accepted tokens under the
    counts, ``match`` = the length of the context suffix it continues."""

    tokens: tuple[int, ...] = ()
    score: float = 0.0
    match: int = 0


NO_DRAFT = SuffixDraft()


class SuffixIndex:
    """Token sequences and their occurrence index (the module docstring). ``max_tokens`` None: unbounded."""

    def __init__(self, max_tokens: int | None = DEFAULT_MEMORY_TOKENS, *, orders: Sequence[int] = ORDERS,
                 max_match: int = MAX_MATCH, recent: int = RECENT, min_prob: float = MIN_PROB,
                 factor: float = MAX_SPEC_FACTOR, offset: float = MAX_SPEC_OFFSET):
        if max_tokens is not None and max_tokens < 0:
            raise ValueError(f"the suffix memory budget must be >= 0 tokens, got {max_tokens}")
        if not 0.0 <= min_prob <= 1.0:
            raise ValueError(f"min_prob must be in [0, 1], got {min_prob}")
        self.orders = tuple(sorted(int(n) for n in orders))
        if not self.orders or self.orders[0] < 1:
            raise ValueError(f"orders must be positive n-gram lengths, got {orders}")
        self.max_tokens = max_tokens
        self.max_match = max(int(max_match), self.orders[-1])
        self.recent = max(1, int(recent))
        self._keep = 4 * self.recent            # occurrences kept per key (the newest)
        self.min_prob, self.factor, self.offset = float(min_prob), float(factor), float(offset)
        self._lock = threading.Lock()
        self._seqs: dict[int, array] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()       # released sequences, least recently used first
        self._open: set[int] = set()
        self._keys: tuple[dict, ...] = tuple({} for _ in self.orders)   # hash -> packed int | array('q')
        self._next = 0
        self.tokens = 0                         # tokens held, open sequences included
        self.evicted_sequences = 0

    # ---- writing -------------------------------------------------------------------------------------
    def open(self) -> int:
        """A new, empty sequence (open: never evicted until ``release``); returns its number."""
        with self._lock:
            self._next += 1
            self._seqs[self._next] = array("i")
            self._open.add(self._next)
            return self._next

    def extend(self, seq_no: int, tokens: Sequence[int]) -> None:
        """Appends ``tokens`` to an open or released sequence and indexes the new positions (a sequence
        evicted meanwhile is ignored)."""
        if not tokens:
            return
        with self._lock:
            seq = self._seqs.get(seq_no)
            if seq is None:
                return
            start = len(seq)
            seq.extend(tokens)
            self.tokens += len(tokens)
            base = seq_no << _SHIFT
            for n, keys in zip(self.orders, self._keys):
                for end in range(max(start + 1, n), len(seq) + 1):
                    self._add(keys, hash(tuple(seq[end - n:end])), base | end)
            if seq_no in self._lru:
                self._lru.move_to_end(seq_no)
            self._evict()

    def _add(self, keys: dict, key: int, packed: int) -> None:
        found = keys.get(key)
        if found is None:
            keys[key] = packed                  # most n-grams occur once: an int, not an array
        elif type(found) is int:
            keys[key] = array("q", (found, packed))
        else:
            found.append(packed)
            if len(found) > 2 * self._keep:
                del found[:len(found) - self._keep]

    def release(self, seq_no: int) -> None:
        """The sequence's writer is done: it stays, evictable (least recently used first)."""
        with self._lock:
            if seq_no in self._open:
                self._open.discard(seq_no)
                self._lru[seq_no] = None
                self._evict()

    def truncate(self, seq_no: int, length: int) -> None:
        """Cuts a sequence to its first ``length`` tokens, removing the index entries of the rest."""
        with self._lock:
            seq = self._seqs.get(seq_no)
            if seq is None or length >= len(seq):
                return
            length = max(0, length)
            self._unindex(seq_no, seq, length)
            self.tokens -= len(seq) - length
            del seq[length:]

    def drop(self, seq_no: int) -> None:
        """Removes a sequence and its index entries now."""
        with self._lock:
            self._open.discard(seq_no)
            self._lru.pop(seq_no, None)
            self._remove(seq_no)

    def _evict(self) -> None:
        while self.max_tokens is not None and self.tokens > self.max_tokens and self._lru:
            seq_no, _ = self._lru.popitem(last=False)
            self._remove(seq_no)
            self.evicted_sequences += 1

    def _remove(self, seq_no: int) -> None:
        seq = self._seqs.pop(seq_no, None)
        if seq is not None:
            self.tokens -= len(seq)
            self._unindex(seq_no, seq, 0)

    def _unindex(self, seq_no: int, seq: array, keep: int) -> None:
        """Removes the entries of ``seq``'s positions past ``keep`` (n-grams ending after it)."""
        for n, keys in zip(self.orders, self._keys):
            for key in {hash(tuple(seq[end - n:end])) for end in range(max(n, keep + 1), len(seq) + 1)}:
                found = keys.get(key)
                if found is None:
                    continue
                if type(found) is int:
                    if found >> _SHIFT == seq_no and found & _MASK > keep:
                        del keys[key]
                    continue
                kept = [p for p in found if p >> _SHIFT != seq_no or p & _MASK <= keep]
                if not kept:
                    del keys[key]
                elif len(kept) == 1:
                    keys[key] = kept[0]
                elif len(kept) < len(found):
                    keys[key] = array("q", kept)

    def add(self, tokens: Sequence[int]) -> int:
        """Stores ``tokens`` as a finished (released, evictable) sequence: text learned elsewhere, read
        back from disk (drafter_service.suffix_store). Returns its number."""
        seq_no = self.open()
        self.extend(seq_no, tokens)
        self.release(seq_no)
        return seq_no

    # ---- reading -------------------------------------------------------------------------------------
    def released(self) -> list[list[int]]:
        """The finished sequences' tokens, least recently used first (the order ``add`` restores them in)."""
        with self._lock:
            return [list(self._seqs[n]) for n in self._lru if n in self._seqs]

    def sequences(self) -> int:
        with self._lock:
            return len(self._seqs)

    def entries(self) -> int:
        """Index entries held (about ``len(orders)`` a stored token)."""
        with self._lock:
            return sum(1 if type(v) is int else len(v) for keys in self._keys for v in keys.values())

    def text(self, seq_no: int) -> list[int]:
        """A sequence's tokens ([] if evicted)."""
        with self._lock:
            return list(self._seqs.get(seq_no, ()))

    def propose(self, context: Sequence[int], max_tokens: int, own: int | None = None) -> SuffixDraft:
        """The best-scored continuation of ``context`` (the module docstring), at most ``max_tokens`` long.
        ``own``: the sequence ``context`` itself is stored as (its current end is not an earlier occurrence)."""
        if max_tokens <= 0 or not context:
            return NO_DRAFT
        tail = array("i", context[-self.max_match:])
        size = len(tail)
        with self._lock:
            own_end = len(self._seqs[own]) if own in self._seqs else -1
            for i in range(len(self.orders) - 1, -1, -1):
                n = self.orders[i]
                if n > size:
                    continue
                found = self._keys[i].get(hash(tuple(tail[size - n:])))
                if found is None:
                    continue
                packed = (found,) if type(found) is int else found[-(self.recent + 1):][::-1]   # newest first
                hi = self.orders[i + 1] - 1 if i + 1 < len(self.orders) else self.max_match
                cands = self._candidates(packed, tail, n, min(hi, size), max_tokens, own, own_end)
                if cands:
                    break
            else:
                return NO_DRAFT
            best, used = self._best(cands, max_tokens)
            for seq_no in used:
                if seq_no in self._lru:
                    self._lru.move_to_end(seq_no)
        return best

    def _candidates(self, packed, tail: array, n: int, hi: int, max_tokens: int, own, own_end: int):
        """(match length, continuation, sequence number) of the occurrences in ``packed`` whose last n
        tokens really match (hashes can collide), at most ``recent``."""
        size = len(tail)
        out = []
        for p in packed:
            seq_no, end = p >> _SHIFT, p & _MASK
            if seq_no == own and end >= own_end:
                continue                        # the context's own end: not an earlier occurrence
            seq = self._seqs.get(seq_no)
            if seq is None or end > len(seq) or seq[end - n:end] != tail[size - n:]:
                continue
            lo, top = n, min(hi, end)           # the longest L in [n, top] with seq[end-L:end] == tail[-L:]
            while lo < top:
                mid = (lo + top + 1) // 2
                if seq[end - mid:end] == tail[size - mid:]:
                    lo = mid
                else:
                    top = mid - 1
            out.append((lo, seq[end:end + max_tokens], seq_no))
            if len(out) >= self.recent:
                break
        return out

    def _best(self, cands, max_tokens: int) -> tuple[SuffixDraft, set[int]]:
        best, used = NO_DRAFT, set()
        for length in sorted({c[0] for c in cands}, reverse=True):
            limit = min(max_tokens, int(self.factor * length + self.offset + 1e-9))
            if limit <= 0 or limit < best.score:
                break                           # shorter matches allow no longer paths: none can score higher
            alive = [c for c in cands if c[0] >= length]
            tokens, score, alive = _greedy_path([c[1] for c in alive], alive, limit, self.min_prob)
            if score > best.score:
                best, used = SuffixDraft(tuple(tokens), score, length), {c[2] for c in alive}
        return best, used


def _greedy_path(conts: list, owners: list, limit: int, min_prob: float) -> tuple[list[int], float, list]:
    """The most frequent path through the continuations ``conts`` (newest first; ``owners`` parallel to
    them), at most ``limit`` tokens, stopping before its probability falls below ``min_prob``. Returns
    (tokens, score, the owners still on the path)."""
    tokens: list[int] = []
    prob, score = 1.0, 0.0
    for j in range(limit):
        if len(conts) == 1:                     # one occurrence left: its text, each token at probability `prob`
            rest = list(conts[0][j:limit])
            tokens += rest
            score += prob * len(rest)
            break
        counts: dict[int, int] = {}
        for c in conts:
            if len(c) > j:
                t = c[j]
                counts[t] = counts.get(t, 0) + 1
        if not counts:
            break
        tok = max(counts, key=counts.__getitem__)   # the first maximum: the most recent on ties
        p = prob * counts[tok] / len(conts)
        if p < min_prob:
            break
        prob, score = p, score + p
        tokens.append(tok)
        keep = [i for i, c in enumerate(conts) if len(c) > j and c[j] == tok]
        conts, owners = [conts[i] for i in keep], [owners[i] for i in keep]
    return tokens, score, owners
