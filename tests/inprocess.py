"""In-process adapters: the domain objects behind the round loop's ports, no network.

Used by the statistical exactness test, which needs tens of thousands of requests.
"""

from __future__ import annotations

from gateway.ports import DrafterLostSession


class LocalVerifier:
    def __init__(self, target):
        self.target = target

    async def start(self, session_id, prompt_ids, sampling, token="", max_draft_length=0):
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
