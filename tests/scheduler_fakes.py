"""What the scheduler's rule tests drive it with (tests/unit/test_batch_wait.py, test_prefill_mixing.py): a
fake clock, a session with only what the scheduler reads, and a session sending its next block."""

from __future__ import annotations

from verifier_service.scheduler import VerifyWork


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Session:
    def __init__(self, name: str):
        self.session_id, self.vtime = name, None


def come_back(scheduler, session, draft=()) -> None:
    """``session`` sends its next block (``draft``: the drafted tokens, a row each beside the pending one)."""
    scheduler._catch_up(session)
    scheduler._verify.append(VerifyWork(session, draft=draft))
    scheduler._expected.pop(session, None)
