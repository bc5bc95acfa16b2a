"""Drafters that follow a fixed rule instead of a model: deterministic continuations for tests of the
paths around a drafter (drafting ahead, the drafter kinds' factory)."""

from __future__ import annotations

from drafter_service.drafter import ContextDrafter, DraftState
from tandem.sessions import SessionStore
from tandem.types import ModelInfo


class RuleDrafter(ContextDrafter):
    """A context drafter over ``vocab_size`` tokens whose ``draft_block`` a subclass writes."""

    kind = "rule"

    def __init__(self, vocab_size: int, max_sessions: int = 8, max_context: int = 0):
        self.sessions = SessionStore(60.0, max_sessions=max_sessions, what="drafter session")
        self._info = ModelInfo(self.kind, vocab_size, "", max_context, ())

    @property
    def info(self) -> ModelInfo:
        return self._info

    def new_state(self) -> DraftState:
        return DraftState()
