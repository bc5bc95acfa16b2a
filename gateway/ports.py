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

    async def end(self, session_id: str, token: str = "") -> str | None:
        """Frees the session; returns why the drafter could not be reached, if it could not (else None)."""

    # Optional: a drafter that drafts ahead of verification (drafter_service.ahead) also offers
    #     open_ahead(session_id, token, sampling) -> AheadPort | None
    # (None: not for this drafter); without it every block is asked for with propose.


class AheadPort(Protocol):
    """One session's drafting-ahead stream (gateway.clients.AheadStream)."""

    async def sync(self, sequence: Sequence[int], ahead: int) -> None:
        """The real sequence is now ``sequence`` (it only grows); keep ``ahead`` tokens drafted beyond it."""

    def usable(self, sequence: Sequence[int]) -> list[DraftToken]:
        """Drafted tokens a block may propose after ``sequence`` now (drafted from exactly that context)."""

    async def wait(self, sequence: Sequence[int], n: int, timeout_s: float) -> list[DraftToken]:
        """``usable(sequence)`` once it holds ``n`` tokens, or what it holds after ``timeout_s``."""

    async def close(self) -> None: ...


class VerifierPort(Protocol):
    async def start(self, session_id: str, prompt_ids: Sequence[int], sampling: SamplingParams, token: str = "",
                    max_draft_length: int = 0, cache_salt: str = "") -> tuple[int, float]:
        """Prefills; ``token`` is the session's secret, ``max_draft_length`` the longest block it will send,
        ``cache_salt`` the scope of the verifier's prefix cache it shares."""

    async def verify(self, session_id: str, draft: Sequence[DraftToken], token: str = "") -> VerifyOutcome: ...

    async def end(self, session_id: str, token: str = "") -> None: ...
