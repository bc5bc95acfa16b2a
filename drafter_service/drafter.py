"""The drafter interface: what the drafter service serves, whatever proposes the tokens.

``Drafter`` is the servicer's view (``info``, ``propose``, ``end_session``, ``sessions``, ``evict_idle``,
``session_count``, ``kv_bytes``). Every kind in this package derives from ``ContextDrafter``, which does
the part all kinds share: argument checks, the session store, and syncing each session's context
(the first ``prefix_length`` tokens it knows + ``appended_tokens``; the prompt and accepted tokens,
never drafts). A kind implements ``new_state()`` and ``draft_block()``; one that can score tokens
given the context (``can_check``, ``check_tokens``) lets prompt lookup check its guesses.

Kinds (``drafter.json`` ``kind``, built by ``drafter_service.factory.load_drafter``):

* ``model`` (``model_drafter.ModelDrafter``): an ONNX causal LM with a KV cache per session;
* prompt lookup (``lookup_drafter.LookupDrafter``): a serving option wrapping any ContextDrafter,
  drafting tokens copied from the context and handing the rest of the block to the inner drafter.

A session holds at most ``info.max_context`` tokens (MAX_CONTEXT_TOKENS where the drafter does not
know its context): a Propose that would make it longer is refused (InvalidInput) before anything is
stored, so no caller can make a session hold more than that. The gateway drafts only within the
drafter's context (its GetInfo); a block that would run past it is shortened.
No torch here.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import numpy as np

from drafter_service.sampling import session_rng
from tandem import telemetry
from tandem.draft_checks import check_ids
from tandem.errors import InvalidInput, UnknownSession
from tandem.sessions import SessionStore, check_session_id
from tandem.types import DraftToken, ModelInfo, Proposal, SamplingParams

DEFAULT_MAX_SESSIONS = 256

RESEND = "resend the whole context with prefix_length 0"
MAX_CONTEXT_TOKENS = 131_072    # the most tokens a session holds when the drafter does not know its max_context



MAX_DRAFT_LENGTH = 64        # the most tokens one Propose may ask for (a block that long never pays)

class Drafter(ABC):
    """What the drafter service (drafter_service.servicer) calls. Thread-safe."""

    sessions: SessionStore

    @property
    @abstractmethod
    def info(self) -> ModelInfo:
        """Model name, vocabulary (size and hash), max_context, EOS ids: what the gateway checks."""

    @abstractmethod
    def propose(self, session_id: str, prefix_length: int, appended_tokens: Sequence[int], k: int,
                sampling: SamplingParams | None = None, min_confidence: float = 0.0,
                token: str | None = None) -> Proposal:
        """Syncs the session to (first ``prefix_length`` known tokens + ``appended_tokens``), drafts up to k
        tokens. Raises tandem.errors.UnknownSession when the session does not know ``prefix_length`` tokens
        (the caller resends the whole context with prefix_length 0), ValueError for bad arguments.
        ``token``: the session's secret (the wire's session_token; None: not checked), see tandem.sessions."""

    def end_session(self, session_id: str, token: str | None = None) -> bool:
        """Frees a session's state; False if it was unknown (NotSessionOwner for a wrong ``token``)."""
        return self.sessions.pop(session_id, token) is not None

    def evict_idle(self, now: float | None = None) -> list[str]:
        """Frees sessions idle for longer than ``sessions.ttl_s``; returns their ids."""
        return self.sessions.evict_idle(now)

    def session_count(self) -> int:
        return self.sessions.count()

    def kv_bytes(self) -> int:
        """Bytes of cache held by all sessions."""
        return self.sessions.total_bytes()


class DraftState:
    """A session's state: the context it last saw and its sampling generator. ``lock`` serialises
    proposals on one session. Kinds subclass it to add their caches (and ``nbytes``)."""

    __slots__ = ("lock", "context", "committed", "rng", "rng_seed", "stop")

    def __init__(self):
        self.lock = threading.Lock()
        self.context: list[int] = []
        self.committed = 0          # context tokens that are real text (the rest: the drafter's own path ahead)
        self.rng: np.random.Generator | None = None
        self.rng_seed: object = None
        self.stop: Callable[[], bool] | None = None   # set during a propose whose caller may void the block

    def generator(self, seed: int | None) -> np.random.Generator:
        """The session's generator for ``seed`` (a new one when the seed changes): seeded runs reproduce."""
        if self.rng is None or self.rng_seed != seed:
            self.rng, self.rng_seed = session_rng(seed), seed
        return self.rng

    @property
    def nbytes(self) -> int:
        return 0


# decide(top_ids, top_probs) -> how many of the checked tokens to keep (see ContextDrafter.check_tokens)
Decide = Callable[[np.ndarray, np.ndarray], int]


class ContextDrafter(Drafter):
    """A drafter keeping each session's context: ``propose`` checks the arguments, syncs the context and
    calls ``draft_block``, under the session's lock."""

    kind = ""
    can_check = False       # True: check_tokens scores tokens (prompt lookup checks short matches with it)

    # ---- what a kind implements

    @abstractmethod
    def new_state(self) -> DraftState:
        """A new session's state."""

    @abstractmethod
    def draft_block(self, state: DraftState, context: list[int], k: int, sampling: SamplingParams,
                    min_confidence: float = 0.0, *, offset: int = 0) -> list[DraftToken]:
        """Drafts up to k tokens continuing ``context`` (which may end with tokens another drafter guessed,
        e.g. lookup tokens: ``state.context`` is the real one). ``offset``: tokens of the block before these
        (the confidence stop never cuts the block's first token). Returns at least one token, except a
        model-free kind with nothing to offer (suffix drafting: an empty block, verified as a plain step)."""

    def check_tokens(self, state: DraftState, context: list[int], tokens: list[int], decide: Decide) -> int:
        """Scores ``tokens`` as a continuation of ``context``: ``decide(top_ids, top_probs)`` is called with the
        drafter's top token (a target id) and its probability at each of the len(tokens) positions (position
        j given context + tokens[:j]) and returns how many tokens to keep; the state is left ready to draft
        after context + tokens[:kept]. Returns kept. Kinds that cannot score keep every token."""
        return len(tokens)

    def drop_cache(self, state: DraftState) -> None:
        """Frees what a state caches beyond its context (called when the context outgrows max_context)."""

    # ---- the shared part

    def propose(self, session_id: str, prefix_length: int, appended_tokens: Sequence[int], k: int,
                sampling: SamplingParams | None = None, min_confidence: float = 0.0,
                token: str | None = None, committed: int | None = None,
                stop: Callable[[], bool] | None = None) -> Proposal:
        """Syncs the session to (first ``prefix_length`` known tokens + ``appended_tokens``), drafts k tokens.
        ``committed``: how many context tokens are real text, the rest being the drafter's own tokens drafted
        ahead (``drafter_service.ahead``); None: all of them (kinds that learn from text learn only those).
        ``stop``: asked between a model kind's drafted tokens; True ends the block there (its caller dropped the
        path it was drafting: the rest would be void).

        ``min_confidence`` > 0 ends the block early (an adaptive draft length): before a model draft
        token whose position's top probability is below it. At least one token is proposed; a block that
        would run past ``max_context`` is shortened.

        Raises UnknownSession for an unknown session with prefix_length > 0 or a prefix longer than the
        session knows, ValueError (InvalidInput) for bad arguments and for a context longer than
        ``max_context`` (nothing is stored then), NotSessionOwner when ``token`` is not the secret the
        session was created with (None: not checked).
        """
        t0 = time.perf_counter()
        check_session_id(session_id, token or "")
        sampling = sampling or SamplingParams()
        sampling.validate()
        k = int(k)
        prefix_length = int(prefix_length)
        if not 1 <= k <= MAX_DRAFT_LENGTH:
            raise InvalidInput(f"k must be between 1 and {MAX_DRAFT_LENGTH}, got {k}")
        min_confidence = float(min_confidence)
        if not 0.0 <= min_confidence <= 1.0:
            raise InvalidInput(f"min_confidence must be in [0, 1], got {min_confidence}")
        if prefix_length < 0:
            raise InvalidInput(f"prefix_length must be >= 0, got {prefix_length}")
        limit = self.info.max_context or MAX_CONTEXT_TOKENS
        if prefix_length + len(appended_tokens) > limit:
            raise InvalidInput(f"the context would be {prefix_length + len(appended_tokens)} tokens, more than this "
                               f"drafter's max_context of {limit}: nothing was kept", param="appended_tokens")
        appended = [int(t) for t in appended_tokens]
        check_ids(appended, self.info.vocab_size or 2**31 - 1, "appended_tokens")     # 0: model-free, any id

        what = self.sessions.what
        if prefix_length > 0:
            session = self.sessions.get(session_id, token)
            if session is None:
                raise UnknownSession(f"unknown {what} {session_id!r} (prefix_length {prefix_length}; never started, "
                                     f"ended, or evicted after being idle): {RESEND}")
        else:
            session, _ = self.sessions.get_or_create(session_id, self.new_state, token)

        with session.lock:
            if prefix_length > len(session.context):
                raise UnknownSession(f"{what} {session_id!r} knows {len(session.context)} tokens, not "
                                     f"{prefix_length}: {RESEND}")
            context = session.context[:prefix_length] + appended
            if not context:
                raise InvalidInput("empty context: a new session needs at least one token")
            session.context = context
            session.committed = len(context) if committed is None else min(len(context), max(0, int(committed)))
            max_ctx = self.info.max_context
            if max_ctx:     # feeding context + k-1 drafts must stay within max_context positions
                k = min(k, max_ctx - len(context) + 1)
            if k < 1:
                self.drop_cache(session)
                tokens = []
            else:
                with telemetry.span("draft", {"tandem.k": k, "tandem.context_tokens": len(context),
                                              "tandem.onnxruntime.runs": k}):
                    session.stop = stop
                    try:
                        tokens = self.draft_block(session, context, k, sampling, min_confidence)
                    finally:
                        session.stop = None
        self.sessions.touch(session_id)
        return Proposal(tokens=tuple(tokens), compute_ms=(time.perf_counter() - t0) * 1000.0)

    def follow(self, session_id: str, context: Sequence[int], token: str | None = None) -> None:
        """The session's real context is now ``context``, drafting nothing (the end of a drafting-ahead stream:
        the tokens emitted since the last block), so kinds that learn from text (``context_followed``) see all
        of it. Unknown sessions are ignored."""
        session = self.sessions.get(session_id, token)
        if session is None:
            return
        context = [int(t) for t in context]
        check_ids(context, self.info.vocab_size or 2**31 - 1, "context")
        with session.lock:
            session.context = context[:self.info.max_context or MAX_CONTEXT_TOKENS]
            session.committed = len(session.context)
            self.context_followed(session)

    def context_followed(self, state: DraftState) -> None:
        """Called by ``follow`` with the session's state: kinds that learn from text index it here."""
