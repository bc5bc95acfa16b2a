"""The session store's capacity rule per caller (tandem.sessions): in a full store, a caller holding more
than half of it gives way to the others, however recently its sessions were used; otherwise only sessions
idle for pressure_idle_s give way. A flooding caller can only push out its own sessions."""

from __future__ import annotations

import pytest

from tandem.errors import CapacityExceeded
from tandem.sessions import CALLER, SessionStore


def _as(caller: str, store: SessionStore, sid: str) -> None:
    token = CALLER.set(caller)
    try:
        store.get_or_create(sid, dict, owner="o")
    finally:
        CALLER.reset(token)


def test_a_caller_holding_more_than_half_gives_way_to_another():
    now = [0.0]
    store = SessionStore(ttl_s=600, max_sessions=4, clock=lambda: now[0], pressure_idle_s=5)
    for i in range(4):
        now[0] += 0.1
        _as("flood", store, f"f{i}")
    _as("gateway", store, "g0")                     # the flood's longest-idle session (f0) gives way
    assert "g0" in store and "f0" not in store and len(store) == 4
    _as("gateway", store, "g1")                     # the flood still holds 3 > 2: f1 goes
    assert "g1" in store and "f1" not in store
    with pytest.raises(CapacityExceeded):           # 2 and 2: nobody holds more than half, nobody is idle
        _as("gateway", store, "g2")
    with pytest.raises(CapacityExceeded):           # the flood cannot push out the gateway's busy sessions
        _as("flood", store, "f9")
    assert all(sid in store for sid in ("g0", "g1", "f2", "f3"))


def test_a_flooding_caller_pushes_out_only_its_own_idle_sessions():
    now = [0.0]
    store = SessionStore(ttl_s=600, max_sessions=4, clock=lambda: now[0], pressure_idle_s=5)
    _as("gateway", store, "g0")
    for i in range(3):
        _as("flood", store, f"f{i}")
    now[0] += 6                                     # everything idle past pressure_idle_s ...
    store.get("g0")                                 # ... but the gateway's session, in use
    for i in range(3, 9):
        _as("flood", store, f"f{i}")                # each pushes out the longest-idle one: the flood's own
        now[0] += 6
        store.get("g0")
    assert "g0" in store and len(store) == 4


def test_without_callers_the_rule_is_the_idle_one():
    """In-process use (no RPC: caller None) keeps the plain rule: the longest idle, once idle long enough."""
    now = [0.0]
    store = SessionStore(ttl_s=600, max_sessions=2, clock=lambda: now[0], pressure_idle_s=5)
    store.get_or_create("a", dict)
    store.get_or_create("b", dict)
    with pytest.raises(CapacityExceeded):
        store.get_or_create("c", dict)
    now[0] += 5
    store.get_or_create("c", dict)
    assert "a" not in store and "c" in store
