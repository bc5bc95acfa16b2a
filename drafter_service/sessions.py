"""A thread-safe store of per-session state with idle eviction (TTL) and size accounting."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


def _nbytes(obj) -> int:
    return int(getattr(obj, "nbytes", 0))


class SessionStore(Generic[T]):
    """Maps session ids to state objects; sessions idle for longer than ``ttl_s`` are evicted.

    ``size_of(obj)`` gives a session's memory (default: its ``nbytes`` attribute), summed by
    ``total_bytes()`` for metrics. ``max_sessions`` (None = unlimited) makes ``get_or_create`` raise
    RuntimeError('too many sessions ...') once full, after evicting idle sessions. Every access
    refreshes a session's idle clock. The store's lock guards the mapping only: callers serialise
    work on one session themselves (e.g. with a lock held by the state object).
    """

    def __init__(self, ttl_s: float = 600.0, *, max_sessions: int | None = None,
                 size_of: Callable[[T], int] = _nbytes, clock: Callable[[], float] = time.monotonic):
        self.ttl_s = float(ttl_s)
        self.max_sessions = max_sessions
        self._size_of = size_of
        self._clock = clock
        self._lock = threading.Lock()
        self._items: dict[str, tuple[T, float]] = {}

    def get(self, session_id: str) -> T | None:
        """The session's state (refreshing its idle clock), or None if unknown."""
        with self._lock:
            entry = self._items.get(session_id)
            if entry is None:
                return None
            self._items[session_id] = (entry[0], self._clock())
            return entry[0]

    def get_or_create(self, session_id: str, factory: Callable[[], T]) -> tuple[T, bool]:
        """(state, created): the existing state, or a new one from ``factory()``."""
        with self._lock:
            now = self._clock()
            entry = self._items.get(session_id)
            if entry is not None:
                self._items[session_id] = (entry[0], now)
                return entry[0], False
            if self.max_sessions is not None and len(self._items) >= self.max_sessions:
                self._evict_locked(now)
                if len(self._items) >= self.max_sessions:
                    raise RuntimeError(f"too many sessions ({len(self._items)}, limit {self.max_sessions})")
            obj = factory()
            self._items[session_id] = (obj, now)
            return obj, True

    def put(self, session_id: str, obj: T) -> None:
        with self._lock:
            self._items[session_id] = (obj, self._clock())

    def touch(self, session_id: str) -> None:
        with self._lock:
            entry = self._items.get(session_id)
            if entry is not None:
                self._items[session_id] = (entry[0], self._clock())

    def pop(self, session_id: str) -> T | None:
        """Removes and returns a session's state (None if unknown)."""
        with self._lock:
            entry = self._items.pop(session_id, None)
            return None if entry is None else entry[0]

    def evict_idle(self, now: float | None = None) -> list[str]:
        """Drops sessions idle for more than ``ttl_s`` (at time ``now``, default the clock); returns their ids."""
        with self._lock:
            return self._evict_locked(self._clock() if now is None else now)

    def _evict_locked(self, now: float) -> list[str]:
        gone = [sid for sid, (_, last) in self._items.items() if now - last > self.ttl_s]
        for sid in gone:
            del self._items[sid]
        return gone

    def count(self) -> int:
        with self._lock:
            return len(self._items)

    __len__ = count

    def __contains__(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._items

    def total_bytes(self) -> int:
        """Sum of ``size_of`` over all sessions (the KV cache bytes held, for the drafter)."""
        with self._lock:
            objs = [obj for obj, _ in self._items.values()]
        return sum(self._size_of(obj) for obj in objs)
