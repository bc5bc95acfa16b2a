"""The one session store (tandem.sessions) both servers use: TTL, capacity, owners, limits."""

import asyncio

import pytest

from tandem.errors import CapacityExceeded, InvalidInput, NotSessionOwner, SessionExists, UnknownSession
from tandem.sessions import MAX_SESSION_ID_LENGTH, SessionStore, check_session_id, evict_forever


def test_ttl_and_capacity_with_a_fake_clock():
    now = [0.0]
    store = SessionStore(ttl_s=10, max_sessions=2, size_of=len, clock=lambda: now[0], pressure_idle_s=60)
    store.get_or_create("a", lambda: [1, 2])
    now[0] = 5
    store.get_or_create("b", lambda: [3])
    assert store.total_bytes() == 3 and len(store) == 2
    with pytest.raises(CapacityExceeded, match="too many"):
        store.get_or_create("c", list)
    now[0] = 12
    assert store.get("b") == [3]              # refreshes b
    assert store.evict_idle() == ["a"]
    store.get_or_create("c", list)            # room again
    assert store.evict_idle(now=30) == ["b", "c"]


def test_a_flood_of_idle_sessions_does_not_lock_out_a_busy_client():
    """Full of sessions nobody uses: the longest idle one makes room; full of busy ones: refused."""
    now = [0.0]
    store = SessionStore(ttl_s=600, max_sessions=3, clock=lambda: now[0], pressure_idle_s=5)
    for i in range(3):
        store.add(f"flood{i}", object(), owner="x")
    now[0] = 6
    store.add("victim", object(), owner="v")            # flood0, idle 6 s, went
    assert "flood0" not in store and "victim" in store
    now[0] = 6.5                                        # everything used within the last 5 s now
    store.require("flood1", owner="x"), store.require("flood2", owner="x")
    with pytest.raises(CapacityExceeded):
        store.add("another", object())
    assert store.require("victim", owner="v") is not None


def test_a_session_belongs_to_its_creator():
    store = SessionStore(ttl_s=600)
    state = object()
    store.add("s", state, owner="secret")
    with pytest.raises(SessionExists):
        store.add("s", object(), owner="other")         # no silent replacement
    with pytest.raises(NotSessionOwner):
        store.require("s", owner="guess")
    with pytest.raises(NotSessionOwner):
        store.pop("s", owner="")
    with pytest.raises(NotSessionOwner):
        store.get_or_create("s", object, owner="guess")
    assert store.require("s", owner="secret") is state    # the victim is undisturbed
    assert store.pop("s", owner="secret") is state
    with pytest.raises(UnknownSession, match="unknown session 's'"):
        store.require("s", owner="secret")


def test_session_ids_and_secrets_are_bounded():
    check_session_id("a" * MAX_SESSION_ID_LENGTH, "t" * 128)
    for bad in ("", "a" * (MAX_SESSION_ID_LENGTH + 1)):
        with pytest.raises(InvalidInput):
            check_session_id(bad)
    with pytest.raises(InvalidInput, match="session_token"):
        check_session_id("s", "t" * 10_000)


def test_the_eviction_loop_frees_idle_sessions():
    now = [0.0]
    store = SessionStore(ttl_s=0.1, clock=lambda: now[0])
    store.add("s", object())
    now[0] = 1.0

    async def run():
        task = asyncio.create_task(evict_forever(store))
        for _ in range(40):
            await asyncio.sleep(0.05)
            if not len(store):
                break
        task.cancel()
        await task
    asyncio.run(run())
    assert len(store) == 0
