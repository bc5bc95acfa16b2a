"""The one session store of the drafter and the verifier: per-session state with idle eviction (TTL),
a capacity, size accounting, and the eviction loop both servers run.

Every access refreshes a session's idle clock. The store's lock guards the mapping only: callers
serialise work on one session themselves (e.g. with a lock held by the state object). The clock is
injectable so tests can move time by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from tandem.errors import CapacityExceeded, SessionExists, UnknownSession

T = TypeVar("T")


def _nbytes(obj) -> int:
    return int(getattr(obj, "nbytes", 0))


class SessionStore(Generic[T]):
    """Maps session ids to state objects; sessions idle for longer than ``ttl_s`` are evicted.

    ``size_of(obj)`` gives a session's memory (default: its ``nbytes`` attribute), summed by
    ``total_bytes()`` for metrics. ``max_sessions`` (None = unlimited): creating one more raises
    CapacityExceeded once full, after evicting idle sessions.
    """

    def __init__(self, ttl_s: float = 600.0, *, max_sessions: int | None = None, what: str = "session",
                 size_of: Callable[[T], int] = _nbytes, clock: Callable[[], float] = time.monotonic):
        self.ttl_s = float(ttl_s)
        self.max_sessions = max_sessions
        self.what = what                    # "drafter session", "verifier session": named in messages
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

    def require(self, session_id: str) -> T:
        """The session's state; raises UnknownSession when there is none."""
        obj = self.get(session_id)
        if obj is None:
            raise UnknownSession(f"unknown {self.what} {_short(session_id)} (never started, already ended, or "
                                 "evicted after being idle)")
        return obj

    def _check_capacity_locked(self, now: float) -> None:
        if self.max_sessions is not None and len(self._items) >= self.max_sessions:
            self._evict_locked(now)
            if len(self._items) >= self.max_sessions:
                raise CapacityExceeded(f"too many open {self.what}s ({len(self._items)}, limit "
                                       f"{self.max_sessions}); end some, wait for idle ones to expire, or raise "
                                       "--max-sessions")

    def get_or_create(self, session_id: str, factory: Callable[[], T]) -> tuple[T, bool]:
        """(state, created): the existing state, or a new one from ``factory()``."""
        with self._lock:
            now = self._clock()
            entry = self._items.get(session_id)
            if entry is not None:
                self._items[session_id] = (entry[0], now)
                return entry[0], False
            self._check_capacity_locked(now)
            obj = factory()
            self._items[session_id] = (obj, now)
            return obj, True

    def add(self, session_id: str, obj: T, *, replace: bool = False) -> None:
        """Stores a new session; SessionExists if the id is open (unless ``replace``), CapacityExceeded if full."""
        with self._lock:
            now = self._clock()
            if session_id in self._items:
                if not replace:
                    raise SessionExists(f"{self.what} {_short(session_id)} is already open")
            else:
                self._check_capacity_locked(now)
            self._items[session_id] = (obj, now)

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

    def values(self) -> list[T]:
        with self._lock:
            return [obj for obj, _ in self._items.values()]

    def total_bytes(self) -> int:
        """Sum of ``size_of`` over all sessions (the KV cache bytes held)."""
        return sum(self._size_of(obj) for obj in self.values())


def _short(session_id: str) -> str:
    return repr(session_id if len(session_id) <= 40 else session_id[:37] + "...")


def evict_period(ttl_s: float) -> float:
    """How often a server looks for idle sessions: a quarter of the TTL, between 0.5 s and 30 s."""
    return min(30.0, max(0.5, ttl_s / 4))


async def evict_forever(store: SessionStore) -> None:
    """The idle-session sweeper both servers run as a task (cancelled when the server stops)."""
    with contextlib.suppress(asyncio.CancelledError):
        while True:
            await asyncio.sleep(evict_period(store.ttl_s))
            store.evict_idle()
