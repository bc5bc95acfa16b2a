"""What the round loop needs from a drafter and a verifier, whatever carries the calls.

The gRPC clients (``gateway.clients``) fill these; so can in-process adapters (tests) or a
model-free drafter (n-gram, prompt lookup).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tandem.types import DraftToken, ModelInfo, Proposal, SamplingParams, VerifyOutcome


class DrafterUnavailable(Exception):
    """The drafter cannot be reached or failed; the round loop falls back to plain decoding."""


class DrafterLostSession(Exception):
    """The drafter does not know the session (restarted, evicted): resend the whole context."""


class DrafterPort(Protocol):
    async def info(self, wait_s: float | None = None) -> ModelInfo:
        """The drafter's model info; ``wait_s``: wait that long for it to become reachable."""

    async def propose(self, session_id: str, prefix_length: int, appended_tokens: Sequence[int], k: int,
                      sampling: SamplingParams, min_confidence: float = 0.0, token: str = "") -> Proposal:
        """Up to k draft tokens (exactly k when ``min_confidence`` is 0). ``token``: the session's secret."""

    async def end(self, session_id: str, token: str = "") -> None: ...


class VerifierPort(Protocol):
    async def start(self, session_id: str, prompt_ids: Sequence[int], sampling: SamplingParams, token: str = "",
                    max_draft_length: int = 0) -> tuple[int, float]:
        """Prefills; ``token`` is the session's secret, ``max_draft_length`` the longest block it will send."""

    async def verify(self, session_id: str, draft: Sequence[DraftToken], token: str = "") -> VerifyOutcome: ...

    async def end(self, session_id: str, token: str = "") -> None: ...
