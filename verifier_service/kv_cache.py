"""Per-session target state: the KV cache, the pending token, and the rollback to the accepted prefix.

Invariant between calls: ``cache`` holds the KV of ``length`` tokens (the prompt and every emitted
token but the last); ``pending_token`` is the last emitted token, not yet in the cache. A verify
pass feeds [pending_token, x_1..x_k], so the cache grows by k+1; ``rollback`` then crops it to
the accepted prefix: length + 1 + accepted.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from tandem.types import SamplingParams


@dataclass
class TargetSession:
    session_id: str
    cache: object                       # static_decoder.StaticKVCache, or a transformers DynamicCache
    length: int                         # tokens whose KV is in the cache
    pending_token: int                  # last emitted token, not yet in the cache
    sampling: SamplingParams
    generator: torch.Generator
    lock: threading.Lock = field(default_factory=threading.Lock)
    max_block: int = 32                 # the longest draft block this session may send

    def rollback(self, keep: int) -> None:
        """Crops the KV cache to its first ``keep`` tokens (drops rejected draft positions)."""
        cached = self.cache.get_seq_length()
        if keep > cached:
            raise ValueError(f"cannot keep {keep} tokens of a cache holding {cached}")
        if keep < cached:
            self.cache.crop(keep - cached)          # DynamicCache.crop(-n) removes the last n
        self.length = keep

    def kv_bytes(self) -> int:
        if hasattr(self.cache, "nbytes"):
            return int(self.cache.nbytes())
        total = 0
        for layer in getattr(self.cache, "layers", []):
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total
