"""The one session store of the drafter and the verifier: per-session state with idle eviction (TTL),
a capacity, an owner per session, size accounting, and the eviction loop both servers run.

Ownership: the call that creates a session gives its secret (``owner``, the wire's ``session_token``);
every later call must give the same one, or it is refused (NotSessionOwner) and the session is left
as it was. Capacity: when the store is full, idle sessions past the TTL go first; then, if another
caller holds more than half of the store, that caller's longest-idle session gives way, however recently
it was used (one caller flooding a node cannot keep the others out: it only ever pushes out its own
sessions); else the session idle the longest, if it has been idle for ``pressure_idle_s`` (a flood of
sessions nobody uses cannot lock out a client that is generating). Only then is a new session refused.
The caller is the peer of the RPC being served (its connection, ``CALLER``, set by ``tandem.serving`` for
every call; None for in-process calls).

Every access refreshes a session's idle clock. The store's lock guards the mapping only: callers
serialise work on one session themselves (e.g. with a lock held by the state object). The clock is
injectable so tests can move time by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hmac
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Generic, TypeVar

from tandem.errors import CapacityExceeded, InvalidInput, NotSessionOwner, SessionExists, UnknownSession

T = TypeVar("T")

MAX_SESSION_ID_LENGTH = 128      # a uuid4 hex is 32; longer ids are refused (INVALID_ARGUMENT)
MAX_SESSION_TOKEN_LENGTH = 128

# Who is calling: the peer address of the RPC being served (tandem.serving sets it around every call; the
# servicers' worker threads inherit it). Sessions are counted per caller for the capacity rule above.
CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("tandem_caller", default=None)


def check_session_id(session_id: str, token: str = "") -> None:
    """Raises InvalidInput for an empty or oversized session id or secret."""
    if not session_id:
        raise InvalidInput("session_id must not be empty")
    if len(session_id) > MAX_SESSION_ID_LENGTH:
        raise InvalidInput(f"session_id is {len(session_id)} characters long; the limit is {MAX_SESSION_ID_LENGTH}")
    if len(token) > MAX_SESSION_TOKEN_LENGTH:
        raise InvalidInput(f"session_token is {len(token)} characters long; the limit is {MAX_SESSION_TOKEN_LENGTH}")


def _nbytes(obj) -> int:
    return int(getattr(obj, "nbytes", 0))


class _Entry:
    __slots__ = ("state", "last", "owner", "caller")

    def __init__(self, state, last: float, owner: str, caller: str | None):
        self.state, self.last, self.owner, self.caller = state, last, owner, caller


class SessionStore(Generic[T]):
    """Maps session ids to state objects; sessions idle for longer than ``ttl_s`` are evicted.

    ``size_of(obj)`` gives a session's memory (default: its ``nbytes`` attribute), summed by
    ``total_bytes()`` for metrics. ``max_sessions`` (None = unlimited): creating one more raises
    CapacityExceeded once full, after evicting idle sessions.
    """

    def __init__(self, ttl_s: float = 600.0, *, max_sessions: int | None = None, what: str = "session",
                 size_of: Callable[[T], int] = _nbytes, clock: Callable[[], float] = time.monotonic,
                 pressure_idle_s: float = 5.0):
        self.ttl_s = float(ttl_s)
        self.max_sessions = max_sessions
        self.pressure_idle_s = float(pressure_idle_s)
        self.what = what                    # "drafter session", "verifier session": named in messages
        self._size_of = size_of
        self._clock = clock
        self._lock = threading.Lock()
        self._items: dict[str, _Entry] = {}

    def _owned_locked(self, session_id: str, owner: str | None) -> _Entry | None:
        """The entry (refreshed), None if unknown; NotSessionOwner if ``owner`` (None: not checked) differs."""
        entry = self._items.get(session_id)
        if entry is None:
            return None
        if owner is not None and not hmac.compare_digest(entry.owner.encode(), owner.encode()):
            raise NotSessionOwner(f"{self.what} {_short(session_id)} belongs to another caller (wrong "
                                  "session_token)")
        entry.last = self._clock()
        return entry

    def get(self, session_id: str, owner: str | None = None) -> T | None:
        """The session's state (refreshing its idle clock), or None if unknown."""
        with self._lock:
            entry = self._owned_locked(session_id, owner)
            return None if entry is None else entry.state

    def require(self, session_id: str, owner: str | None = None) -> T:
        """The session's state; raises UnknownSession when there is none, NotSessionOwner for a wrong owner."""
        obj = self.get(session_id, owner)
        if obj is None:
            raise UnknownSession(f"unknown {self.what} {_short(session_id)} (never started, already ended, or "
                                 "evicted after being idle)")
        return obj

    def _check_capacity_locked(self, now: float, caller: str | None) -> None:
        if self.max_sessions is not None and len(self._items) >= self.max_sessions:
            self._evict_locked(now)
            if len(self._items) >= self.max_sessions:       # full of live sessions: one may give way
                victim = self._giving_way_locked(now, caller)
                if victim is not None:
                    del self._items[victim]
            if len(self._items) >= self.max_sessions:
                raise CapacityExceeded(f"too many open {self.what}s ({len(self._items)}, limit "
                                       f"{self.max_sessions}); end some, wait for idle ones to expire, or raise "
                                       "--max-sessions")

    def _giving_way_locked(self, now: float, caller: str | None) -> str | None:
        """The session that makes room for a new one of ``caller`` in a full store (see the module docstring):
        the longest-idle one of another caller holding more than half the store, else the longest-idle one
        if idle for ``pressure_idle_s``; None: nobody gives way."""
        heavy, held = Counter(e.caller for e in self._items.values()).most_common(1)[0]
        if heavy != caller and held > self.max_sessions // 2:
            return min((sid for sid, e in self._items.items() if e.caller == heavy),
                       key=lambda sid: self._items[sid].last)
        sid, entry = min(self._items.items(), key=lambda kv: kv[1].last)
        return sid if now - entry.last >= self.pressure_idle_s else None

    def get_or_create(self, session_id: str, factory: Callable[[], T], owner: str | None = None) -> tuple[T, bool]:
        """(state, created): the existing state (its owner checked), or a new one from ``factory()`` owned by
        ``owner``."""
        with self._lock:
            entry = self._owned_locked(session_id, owner)
            if entry is not None:
                return entry.state, False
            now, caller = self._clock(), CALLER.get()
            self._check_capacity_locked(now, caller)
            obj = factory()
            self._items[session_id] = _Entry(obj, now, owner or "", caller)
            return obj, True

    def _exists(self, session_id: str) -> SessionExists:
        return SessionExists(f"{self.what} {_short(session_id)} is already open; end it first or use a new "
                             "session_id")

    def check_free(self, session_id: str) -> None:
        """Raises SessionExists if ``session_id`` is open (``add`` checks it too; call this first to fail before
        expensive work such as a prefill)."""
        if session_id in self:
            raise self._exists(session_id)

    def add(self, session_id: str, obj: T, owner: str = "") -> None:
        """Stores a new session owned by ``owner``; SessionExists if the id is open, CapacityExceeded if full."""
        with self._lock:
            now, caller = self._clock(), CALLER.get()
            if session_id in self._items:
                raise self._exists(session_id)
            self._check_capacity_locked(now, caller)
            self._items[session_id] = _Entry(obj, now, owner, caller)

    def touch(self, session_id: str) -> None:
        with self._lock:
            self._owned_locked(session_id, None)

    def pop(self, session_id: str, owner: str | None = None) -> T | None:
        """Removes and returns a session's state (None if unknown); NotSessionOwner (nothing removed) for a wrong
        owner."""
        with self._lock:
            if self._owned_locked(session_id, owner) is None:
                return None
            return self._items.pop(session_id).state

    def evict_idle(self, now: float | None = None) -> list[str]:
        """Drops sessions idle for more than ``ttl_s`` (at time ``now``, default the clock); returns their ids."""
        with self._lock:
            return self._evict_locked(self._clock() if now is None else now)

    def _evict_locked(self, now: float) -> list[str]:
        gone = [sid for sid, e in self._items.items() if now - e.last > self.ttl_s]
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
            return [entry.state for entry in self._items.values()]

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
