"""Per-session target state: the KV cache, the pending token, and the rollback to the accepted prefix.

Invariant between calls: ``cache`` holds the KV of ``length`` tokens (the prompt and every emitted
token but the last); ``pending_token`` is the last emitted token, not yet in the cache. A verify
pass feeds [pending_token, x_1..x_k], so the cache grows by k+1; ``rollback`` then crops it to
the accepted prefix: length + 1 + accepted.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch

from tandem.types import SamplingParams


class UnknownSessionError(KeyError):
    """No session with that id (never started, ended, or evicted after its TTL)."""

    def __str__(self) -> str:
        return f"unknown session {self.args[0]!r} (never started, already ended, or evicted after being idle)"


@dataclass
class TargetSession:
    session_id: str
    cache: object                       # transformers DynamicCache
    length: int                         # tokens whose KV is in the cache
    pending_token: int                  # last emitted token, not yet in the cache
    sampling: SamplingParams
    generator: torch.Generator
    last_used: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def rollback(self, keep: int) -> None:
        """Crops the KV cache to its first ``keep`` tokens (drops rejected draft positions)."""
        cached = self.cache.get_seq_length()
        if keep > cached:
            raise ValueError(f"cannot keep {keep} tokens of a cache holding {cached}")
        if keep < cached:
            self.cache.crop(keep - cached)          # DynamicCache.crop(-n) removes the last n
        self.length = keep

    def kv_bytes(self) -> int:
        total = 0
        for layer in getattr(self.cache, "layers", []):
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total


class SessionStore:
    """Thread-safe map of session id -> TargetSession, with eviction of idle sessions."""

    def __init__(self, ttl_s: float = 600.0, max_sessions: int = 256):
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._sessions: dict[str, TargetSession] = {}
        self._lock = threading.Lock()

    def add(self, session: TargetSession) -> None:
        with self._lock:
            self._evict_locked(time.monotonic())
            if session.session_id not in self._sessions and len(self._sessions) >= self.max_sessions:
                raise RuntimeError(f"too many open sessions ({self.max_sessions}); end some or raise --max-sessions")
            self._sessions[session.session_id] = session

    def get(self, session_id: str) -> TargetSession:
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                raise UnknownSessionError(session_id)
            session.last_used = time.monotonic()
            return session

    def pop(self, session_id: str) -> TargetSession | None:
        with self._lock:
            return self._sessions.pop(session_id, None)

    def evict_idle(self, now: float | None = None) -> int:
        with self._lock:
            return self._evict_locked(time.monotonic() if now is None else now)

    def _evict_locked(self, now: float) -> int:
        stale = [sid for sid, s in self._sessions.items() if now - s.last_used > self.ttl_s]
        for sid in stale:
            del self._sessions[sid]
        return len(stale)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def kv_bytes(self) -> int:
        with self._lock:
            sessions = list(self._sessions.values())
        return sum(s.kv_bytes() for s in sessions)
