"""The verifier's scheduler keeps a batch of sessions whole: after a forward, the first session back waits a
bounded time for the others of that forward (verifier_service.scheduler). Driven through the decision rule
with a fake clock and a fake runner, so nothing here depends on how fast the machine is."""

from __future__ import annotations

import pytest

from scheduler_fakes import Clock, Session, come_back
from verifier_service.scheduler import BATCH_WAIT_SHARE, Runner, Scheduler, VerifyWork


class FortyMsForward(Runner):
    """Every verify forward takes 40 ms of the fake clock and accepts nothing."""

    def __init__(self, clock: Clock):
        self.clock = clock

    def run_verify(self, batch, ahead=(), mixed=None):
        self.clock.t += 0.040
        for work in batch:
            work.future.set_result(None)


def after_one_shared_forward(batch_wait_ms: float):
    """A scheduler whose last forward verified sessions a, b, c together, 1 ms ago."""
    clock = Clock()
    scheduler = Scheduler(FortyMsForward(clock), batch_wait_ms=batch_wait_ms, clock=clock)
    sessions = [Session(n) for n in "abc"]
    for s in sessions:
        scheduler._catch_up(s)
        scheduler._verify.append(VerifyWork(s))
    what, (batch, *_), _ = scheduler._decide(clock())
    assert what == "verify" and len(batch) == 3
    scheduler._run(what, (batch, [], None))
    scheduler._last_forward_end = clock()
    clock.t += 0.001
    return clock, scheduler, sessions


def test_the_first_session_back_waits_for_the_others_of_its_forward_then_all_go_together():
    clock, scheduler, (a, b, c) = after_one_shared_forward(-1.0)          # the default: a share of the forward
    come_back(scheduler, a)
    what, _, wait = scheduler._decide(clock())
    assert what is None and wait == pytest.approx(BATCH_WAIT_SHARE * 0.040 - 0.001)
    come_back(scheduler, b)
    assert scheduler._decide(clock())[0] is None                             # c is still expected
    come_back(scheduler, c)
    what, (batch, *_), _ = scheduler._decide(clock())
    assert what == "verify" and [w.session for w in batch] == [a, b, c]      # whole again, no wait left


def test_the_wait_is_bounded_and_a_session_that_ended_is_not_waited_for():
    clock, scheduler, (a, b, c) = after_one_shared_forward(-1.0)
    come_back(scheduler, a)
    scheduler.forget(b)                                                      # b's request ended
    clock.t += BATCH_WAIT_SHARE * 0.040                                      # c is late: the wait is over
    what, (batch, *_), _ = scheduler._decide(clock())
    assert what == "verify" and [w.session for w in batch] == [a]


def test_no_wait_when_told_not_to():
    clock, scheduler, (a, b, c) = after_one_shared_forward(0.0)
    come_back(scheduler, a)
    what, (batch, *_), _ = scheduler._decide(clock())
    assert what == "verify" and [w.session for w in batch] == [a]


class ClientQuickerThanTheLock(FortyMsForward):
    """Each session's client sends its next block as soon as its future settles, before the forward's
    bookkeeping takes the scheduler's lock (a real client on another thread can)."""

    def __init__(self, clock: Clock, scheduler_of):
        super().__init__(clock)
        self.scheduler_of = scheduler_of

    def run_verify(self, batch, ahead=(), mixed=None):
        super().run_verify(batch, ahead, mixed)
        for work in batch:
            come_back(self.scheduler_of(), work.session)


def test_a_session_back_before_the_forward_is_booked_is_not_waited_for():
    """The single client's case: its next block is already queued, so nobody is expected and it goes at
    once (waiting for itself cost a quarter of every forward: 3.9 ms median queue at 18 ms forwards)."""
    clock = Clock()
    scheduler = Scheduler(ClientQuickerThanTheLock(clock, lambda: scheduler), batch_wait_ms=-1.0, clock=clock)
    a = Session("a")
    come_back(scheduler, a)
    for _ in range(3):
        what, work, wait = scheduler._decide(clock())
        assert what == "verify" and [w.session for w in work[0]] == [a] and not work[1], wait
        scheduler._run(what, work)
        scheduler._last_forward_end = clock()
        assert not scheduler._expected
