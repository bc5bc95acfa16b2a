"""Prompt prefixes kept from ended sessions, so a prompt that begins with them is not prefilled again.

A chat client resends the whole conversation every turn, and an agent resends the same scaffold with each
call: the next request's prompt begins with tokens an ended session already had in its KV cache (its prompt
and its output). ``PrefixCache`` keeps the caches of ended sessions, with the tokens they hold, up to a byte
budget (least recently used first out); a new session takes the K/V of its longest common prefix with any of
them (a copy: the entry stays for the next request) and prefills only the rest.

Exactness. The reused K/V are bit-identical to what a prefill of the same tokens would compute only where a
token's rows do not depend on the forward they ran in: the prompt's chunks, a plain step and a verify block
give every row the same bits (``Target.caches_prefixes``: the static decoder with width-independent rows and
prefill chunks on the same row-exact kernels, the int8 x8 path). There, a request's logits, tokens and seeded
samples are the same with or without the cache, and whatever one session left in it can change another's
speed only, never its output. On any other path the cache is off (the start-up line says so).

What it does not hide: a request whose prompt begins like a recent one gets its first token sooner, so a
client can tell that someone sent that prefix lately (the timing side channel of every prefix cache). A
request's ``cache_salt`` (vLLM's name; the gateway's ``cache_salt`` field, the verifier's StartSession) scopes
it: entries are shared only among sessions of the same salt, so clients that are given different salts
cannot time each other's prefixes (and a benchmark keeps its modes apart). The verifier's
``--prefix-cache-mb 0`` turns it off.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

MIN_PREFIX = 16                # fewer common tokens than this: prefill them (not worth an entry's copy)


@dataclass
class Entry:
    salt: str                  # shared only with sessions of this salt
    tokens: np.ndarray         # the token ids whose K/V ``kv`` holds, in order
    kv: torch.Tensor           # [layers, 2, kv_heads, capacity >= len(tokens), head_dim], positions < len valid

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


@dataclass
class Hit:
    """What a new session takes: the first ``length`` positions of ``kv``."""

    kv: torch.Tensor
    length: int


class PrefixCache:
    """Ended sessions' K/V by the tokens they hold, at most ``max_bytes`` in all. Thread-safe: ``put`` runs on
    the caller ending a session, ``match`` on the caller starting one; the copy (``copy_into``) on the torch
    thread."""

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict[int, Entry] = OrderedDict()     # oldest use first
        self._next = 0
        self._lock = threading.Lock()
        self.hits = 0              # sessions that took a prefix
        self.reused_tokens = 0     # prompt tokens taken from the cache instead of prefilled
        self.prompt_tokens = 0     # prompt tokens of every session looked up

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, tokens: Sequence[int], kv: torch.Tensor, salt: str = "") -> None:
        """Keeps ``kv``'s first ``len(tokens)`` positions as the K/V of ``tokens`` (``kv`` is not written again by
        its session: the caller ends it). Entries whose tokens are a prefix of these go (this one answers
        every prompt they would); then the least recently used, until the budget holds."""
        tokens = np.asarray(tokens, dtype=np.int64)
        entry = Entry(str(salt), tokens, kv)
        if len(tokens) < MIN_PREFIX or entry.nbytes > self.max_bytes:
            return
        with self._lock:
            for key in [k for k, e in self._entries.items() if e.salt == entry.salt
                        and len(e.tokens) <= len(tokens) and _common(e.tokens, tokens) == len(e.tokens)]:
                del self._entries[key]
            self._entries[self._next] = entry
            self._next += 1
            total = sum(e.nbytes for e in self._entries.values())
            while total > self.max_bytes:
                _, old = self._entries.popitem(last=False)
                total -= old.nbytes

    def match(self, prompt_ids: Sequence[int], salt: str = "") -> Hit | None:
        """The longest common prefix of ``prompt_ids`` with any entry of the same ``salt``, leaving at least the prompt's last token to
        prefill (its row gives the first token's logits); None below MIN_PREFIX tokens. The entry becomes the
        most recently used; the hit keeps its tensor alive even if the entry is evicted before the copy."""
        prompt = np.asarray(prompt_ids, dtype=np.int64)
        limit = len(prompt) - 1
        best, best_key, best_len = None, None, 0
        with self._lock:
            self.prompt_tokens += len(prompt)
            for key, entry in self._entries.items():
                if entry.salt != salt:
                    continue
                n = min(_common(entry.tokens, prompt), limit)
                if n > best_len:
                    best, best_key, best_len = entry, key, n
            if best is None or best_len < MIN_PREFIX:
                return None
            self._entries.move_to_end(best_key)
            self.hits += 1
            self.reused_tokens += best_len
        return Hit(best.kv, best_len)


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two token arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
