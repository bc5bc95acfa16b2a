"""Suffix drafting as a drafter: the continuation the home's traffic suggests, copied as point masses.

``SuffixDrafter(inner=None)`` is the model-free kind ``suffix``: no model at all, so it serves any target
(its ModelInfo says ``model_free``; token ids are checked against the int32 range only). With an
``inner`` drafter it is a wrapper, as prompt lookup is: the suffix tokens first, the inner drafter
drafts the rest of the block. Each session's text (prompt + accepted tokens, never drafts: the context
the gateway syncs) is a sequence of a ``drafter_service.suffix.SuffixIndex``; a block is that index's
best-scored continuation of the context (``SuffixIndex.propose``). A model-free drafter with nothing to
offer proposes an empty block, which the gateway verifies as a plain step.

Scope (``--suffix-scope``):

* ``global`` (default): one index for all sessions: a session drafts from its own text and from every
  other session's, in flight or finished; finished sessions' text is kept within ``memory_tokens``
  (least recently used evicted first). The drafter learns the home's traffic as it serves it.
* ``session``: each session drafts from its own prompt and output only, nothing kept after it ends.
* ``off``: no suffix drafting (the wrapper is not built; a model-free drafter would draft nothing).

What crosses sessions in ``global`` scope: another session's text can be *proposed* to a session, never
*emitted* by it: every draft token is verified exactly (greedy: kept only if it is the target's own
argmax; sampled: q is a point mass, so the token is kept with probability p(x) under the target and
otherwise replaced by a sample from the target's residual), so each session's output is exactly what
the target would produce alone, whatever other sessions wrote. What can leak is speed: a session whose
text continues another session's is generated faster, so a client measuring its own latency learns
whether such text passed through the drafter (a timing side channel). ``session`` scope closes it
(each session only speeds up on its own text); ``off`` removes suffix drafting.

Exact: the proposal is a deterministic function of the context and of text the drafter saw before
(never of the target's probabilities for the block), reported with q = a point mass, as prompt lookup's
copies are (``from_lookup`` True, ``origin`` "suffix"). Each copy also says how long a match it stands on
(``match_length``: the context's matched suffix plus the copies before it in the block): the gateway learns
how often copies are kept per match length, so a copy of text seen before word for word is priced as such.
"""

from __future__ import annotations

import dataclasses
import weakref

from drafter_service.drafter import DEFAULT_MAX_SESSIONS, ContextDrafter, DraftState
from drafter_service.suffix import DEFAULT_MEMORY_TOKENS, SuffixIndex
from tandem.lookup import lookup_proposal
from tandem.sessions import SessionStore
from tandem.types import DraftToken, ModelInfo, SamplingParams

SCOPES = ("global", "session", "off")
MODEL_FREE_NAME = "suffix"


def check_scope(scope: str) -> str:
    if scope not in SCOPES:
        raise ValueError(f"--suffix-scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    return scope


class SuffixState(DraftState):
    """A session of the suffix drafter: its sequence in the index (``seq``), how much of its context that
    holds (``synced``), and the inner drafter's state, if any. When the state is dropped (the
    session ended or was evicted) its sequence is released to the index: kept (global scope) within the
    memory budget, or freed with the session's own index (session scope)."""

    __slots__ = ("index", "seq", "synced", "inner", "__weakref__")

    def __init__(self, index: SuffixIndex, inner: DraftState | None):
        super().__init__()
        self.index, self.inner = index, inner
        self.seq = index.open()
        self.synced: list[int] = []     # a copy of the context the sequence holds
        weakref.finalize(self, index.release, self.seq)

    def generator(self, seed):
        return self.inner.generator(seed) if self.inner is not None else super().generator(seed)

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes if self.inner is not None else 0


class SuffixDrafter(ContextDrafter):
    """Suffix drafting, alone (``inner`` None: the model-free kind) or in front of ``inner``."""

    kind = "suffix"

    def __init__(self, inner: ContextDrafter | None = None, *, scope: str = "global",
                 memory_tokens: int = DEFAULT_MEMORY_TOKENS, session_ttl_s: float = 600.0,
                 max_sessions: int | None = DEFAULT_MAX_SESSIONS, index: SuffixIndex | None = None):
        if check_scope(scope) == "off":
            raise ValueError("--suffix-scope off turns suffix drafting off: a model-free drafter would draft "
                             "nothing (use --suffix-scope session to keep each session's text to itself)")
        if inner is not None and not isinstance(inner, ContextDrafter):
            raise TypeError(f"suffix drafting wraps a ContextDrafter (it needs each session's context), "
                            f"not {type(inner).__name__}")
        self.inner, self.scope = inner, scope
        self.memory_tokens = int(memory_tokens)
        self.index = (index or SuffixIndex(self.memory_tokens)) if scope == "global" else None
        self.sessions = (inner.sessions if inner is not None else
                         SessionStore(session_ttl_s, max_sessions=max_sessions, what="drafter session"))
        self._info: tuple[ModelInfo | None, ModelInfo] | None = None

    @property
    def info(self) -> ModelInfo:
        """Model-free: no vocabulary (size 0, no hash) and ``model_free``; as a wrapper, the inner drafter's
        info (its lookup rule included) under the name ``<inner>+suffix``."""
        if self.inner is None:
            if self._info is None:
                self._info = (None, ModelInfo(MODEL_FREE_NAME, 0, "", 0, (), model_free=True))
            return self._info[1]
        inner = self.inner.info
        if self._info is None or self._info[0] is not inner:
            self._info = (inner, dataclasses.replace(inner, model_name=f"{inner.model_name}+suffix"))
        return self._info[1]

    @property
    def can_check(self) -> bool:
        return self.inner is not None and self.inner.can_check

    def new_state(self) -> SuffixState:
        inner = self.inner.new_state() if self.inner is not None else None
        return SuffixState(self.index if self.index is not None else SuffixIndex(None), inner)

    def context_followed(self, state: SuffixState) -> None:
        _sync(state)
        if self.inner is not None:
            self.inner.context_followed(state.inner)

    def drop_cache(self, state: SuffixState) -> None:
        if self.inner is not None:
            self.inner.drop_cache(state.inner)

    def check_tokens(self, state: SuffixState, context, tokens, decide) -> int:
        return self.inner.check_tokens(state.inner, context, tokens, decide) if self.inner is not None else len(tokens)

    def draft_block(self, state: SuffixState, context: list[int], k: int, sampling: SamplingParams,
                    min_confidence: float = 0.0, *, offset: int = 0) -> list[DraftToken]:
        """The suffix continuation (possibly none), then the inner drafter for the rest of the block."""
        _sync(state)
        found = state.index.propose(context, k, own=state.seq)
        # each copy with the tokens before it that agreed with its source: the match, then the copies before it
        tokens = [dataclasses.replace(t, origin="suffix", match_length=found.match + j)
                  for j, t in enumerate(lookup_proposal(found.tokens, sampling))]
        if self.inner is None or len(tokens) == k:
            return tokens
        state.inner.stop = state.stop
        return tokens + self.inner.draft_block(state.inner, context + list(found.tokens), k - len(tokens), sampling,
                                               min_confidence, offset=offset + len(tokens))


def _sync(state: SuffixState) -> None:
    """Makes the session's sequence hold its real context (the prompt, then accepted tokens; never the tokens
    the drafter drafted ahead beyond it): the new tokens are appended; where the context left what was indexed
    (a client that went back), the sequence is cut to the common part first."""
    context, seen = state.context[:state.committed], state.synced
    done = len(seen)
    if context[:done] != seen:
        done = 0
        while done < min(len(seen), len(context)) and seen[done] == context[done]:
            done += 1
        state.index.truncate(state.seq, done)
    state.index.extend(state.seq, context[done:])
    state.synced = list(context)
