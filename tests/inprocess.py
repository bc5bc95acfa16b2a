"""In-process adapters: the domain objects behind the round loop's ports, no network.

Used by the statistical exactness test, which needs tens of thousands of requests.
"""

from __future__ import annotations

from gateway.ports import DrafterLostSession


class LocalVerifier:
    def __init__(self, target):
        self.target = target

    async def start(self, session_id, prompt_ids, sampling, token="", max_draft_length=0, cache_salt=""):
        return self.target.start(session_id, prompt_ids, sampling)

    async def verify(self, session_id, draft, token=""):
        return self.target.verify(session_id, draft)

    async def end(self, session_id, token=""):
        self.target.end(session_id)


class LocalDrafter:
    def __init__(self, drafter):
        self.drafter = drafter

    async def info(self, wait_s=None):
        return self.drafter.info

    async def propose(self, session_id, prefix_length, appended_tokens, k, sampling, min_confidence=0.0, token=""):
        try:
            return self.drafter.propose(session_id, prefix_length, appended_tokens, k, sampling, min_confidence)
        except KeyError as exc:
            raise DrafterLostSession(str(exc)) from exc

    async def end(self, session_id, token=""):
        self.drafter.end_session(session_id)


class LocalAhead:
    """A drafting-ahead stream without the network: the drafter's path (drafter_service.ahead.AheadPath) and the
    gateway's copy of it (gateway.ahead.DraftedPath); each sync drafts at once all the path wants."""

    def __init__(self, drafter, session_id, token, sampling):
        from drafter_service.ahead import AheadPath
        from gateway.ahead import DraftedPath

        self.path = AheadPath(drafter, session_id, token, sampling)
        self.copy = DraftedPath()
        self.sent = 0

    async def sync(self, sequence, ahead):
        self.path.sync(self.sent, list(sequence[self.sent:]), ahead)
        self.sent = len(sequence)
        self.copy.stalled = False
        while self.path.wanted():
            chunk = self.path.draft()
            if chunk is not None:
                self.copy.receive(chunk.path_id, chunk.position, chunk.tokens, chunk.last)

    def usable(self, sequence):
        return self.copy.usable(sequence)

    async def wait(self, sequence, n, timeout_s):
        return self.copy.usable(sequence)

    async def close(self):
        self.path.finish()
        self.path.drafter.end_session(self.path.session_id)


class LocalAheadDrafter(LocalDrafter):
    """LocalDrafter that also drafts ahead (LocalAhead), as a DraftAhead drafter does."""

    def open_ahead(self, session_id, token, sampling):
        return LocalAhead(self.drafter, session_id, token, sampling)
