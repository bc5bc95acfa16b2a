"""Per-session target state: the KV cache, the pending token, and the rollback to the accepted prefix.

Invariant between calls: ``cache`` holds the KV of ``length`` tokens (the prompt and every emitted
token but the last); ``pending_token`` is the last emitted token, not yet in the cache. A verify
pass feeds [pending_token, x_1..x_k], so the cache grows by k+1; ``rollback`` then crops it to
the accepted prefix: length + 1 + accepted.

The cache is the one record of a session's length: ``TargetSession.length`` reads it (less the rows
of a verify block still being judged, ``in_flight``), a forward advances it, and ``rollback`` is the one
place it moves back (and the block's rows stop being in flight).

``StaticKVCache`` (the decoder's cache): one preallocated tensor indexed by position; the rollback
moves its length back, nothing is copied. Sliding-window layers keep every position too (their
attention reads only the window).
"""

from __future__ import annotations

import math

import torch

from tandem.types import SamplingParams

CACHE_STEP = 256              # the static cache grows in steps of this many positions (at least doubling)


class StaticKVCache:
    """K and V of every layer for one session: one tensor [layers, 2, kv_heads, capacity, head_dim],
    indexed by position. ``length`` positions are valid; ``crop`` moves the length back (the rollback);
    ``reserve`` grows the capacity (a copy, at least doubling) before a forward writes past it."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, max_length: int, capacity: int | None = None):
        self.max_length = int(max_length)
        capacity = CACHE_STEP if capacity is None else int(capacity)
        # empty, not zeros: positions >= length are written before they are read, and a fill is a parallel
        # region, which must not run off the torch thread (verifier_service.torch_thread)
        self.kv = torch.empty(layers, 2, kv_heads, max(1, min(capacity, self.max_length)), head_dim)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.kv.shape[3]

    def reserve(self, length: int) -> None:
        if length > self.max_length:
            raise ValueError(f"{length} positions exceed the target's context of {self.max_length}")
        if length <= self.capacity:
            return
        capacity = min(self.max_length, max(2 * self.capacity, math.ceil(length / CACHE_STEP) * CACHE_STEP))
        grown = self.kv.new_empty(*self.kv.shape[:3], capacity, self.kv.shape[4])
        grown[:, :, :, :self.length] = self.kv[:, :, :, :self.length]
        self.kv = grown

    def load_prefix(self, kv: torch.Tensor, length: int, reserve: int) -> None:
        """Starts this (empty) cache with the first ``length`` positions of another cache's ``kv`` (a prefix
        taken from ``verifier_service.prefix_cache``), room made for ``reserve`` positions. On the torch thread:
        the copy is a parallel region."""
        if self.length:
            raise ValueError("a prefix goes into an empty cache")
        self.reserve(max(int(length), int(reserve)))
        self.kv[:, :, :, :length] = kv[:, :, :, :length]
        self.length = int(length)

    # the DynamicCache calls TargetSession uses
    def get_seq_length(self) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        """Keeps the first ``max_length`` positions (negative: drops the last -max_length), as DynamicCache.crop."""
        keep = self.length + max_length if max_length < 0 else max_length
        if not 0 <= keep <= self.length:
            raise ValueError(f"cannot keep {keep} of {self.length} cached positions")
        self.length = keep

    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


class TargetSession:
    """One session's cache, pending token, sampling and generator. ``cached``: the tokens already in
    ``cache`` when the session is made (checked: the cache itself is the record from then on). ``cache`` None:
    made by the first prefill forward (on the torch thread). ``vtime``: the session's clock in the scheduler's
    fair share (``verifier_service.scheduler``)."""

    def __init__(self, session_id: str, cache, cached: int, pending_token: int, sampling: SamplingParams,
                 generator: torch.Generator | None, max_block: int = 32):
        held = 0 if cache is None else cache.get_seq_length()
        if cached != held:
            raise ValueError(f"session {session_id!r}: the cache holds {held} tokens, not {cached}")
        self.session_id = session_id
        self.cache = cache                  # StaticKVCache, or a transformers DynamicCache (None: not made yet)
        self.pending_token = pending_token  # last emitted token, not yet in the cache
        self.sampling = sampling
        self.generator = generator
        self.max_block = max_block          # the longest draft block this session may send
        self.in_flight = 0                  # rows of a verify block in the cache, not yet accepted or dropped
        self.ahead: torch.Tensor | None = None   # logits [1, V] of the pending token's row, computed ahead of
                                                 # the next block (its K/V in the cache, counted in in_flight)
        self.ahead_failed = False           # that forward failed: not tried again before the next round
        self.vtime: float | None = None     # set by the scheduler when the session's first work is queued
        self.tokens: list[int] = []         # the ids whose K/V the cache holds, once prefilled (for the prefix
                                            # cache: ``verifier_service.prefix_cache``)
        self.cache_salt = ""                # the prefix cache's scope it takes from and leaves to

    @property
    def length(self) -> int:
        """Tokens of the session whose KV is in the cache (a verify block being judged not counted)."""
        return 0 if self.cache is None else int(self.cache.get_seq_length()) - self.in_flight

    def rollback(self, keep: int) -> None:
        """Crops the KV cache to its first ``keep`` tokens (drops rejected draft positions); the block in
        flight, if any, is settled."""
        cached = int(self.cache.get_seq_length())
        if not 0 <= keep <= cached:
            raise ValueError(f"cannot keep {keep} tokens of a cache holding {cached}")
        if keep < cached:
            self.cache.crop(keep - cached)          # DynamicCache.crop(-n) removes the last n
        self.in_flight = 0
        self.ahead = None

    def kv_bytes(self) -> int:
        if self.cache is None:
            return 0
        if hasattr(self.cache, "nbytes"):
            return int(self.cache.nbytes())
        total = 0
        for layer in getattr(self.cache, "layers", []):
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total
