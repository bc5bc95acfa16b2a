"""Drafting ahead of verification: one session's path of drafted tokens beyond the real context.

The gateway tells the drafter the real context (prompt + emitted tokens) as it grows, one message a round,
and how many tokens it wants drafted beyond it (``ahead``). The drafter keeps a *path*: tokens it drafted
continuing the real context, one after another, each from the context before it (real tokens, then the
path's own). While the verifier checks one block, the drafter drafts the next one on its own box, so when
the round ends the next block is usually there already: the drafter's time and the link's round trip leave
the critical path.

When the real context grows along the path (the block was accepted and the target's own next token is the
path's next token), the rest of the path stays valid and drafting goes on from its end. When it grows along
the whole path and past its end while a chunk is being drafted (the gateway used every token that had
arrived, and the target's bonus token came on top), the chunk is kept where it agrees with the new real
context: its tokens beyond it continue the same path. When the context leaves the path (a rejected token,
another bonus token), the path is dropped and a new one (a new ``path_id``) is drafted from the real context;
chunks of a dropped path that were in flight are void.

Exactness: every token of a path is drawn by the drafter's own randomness from q(. | c), c the context
before it, and q is reported with it. The gateway uses a token only where c is the real context (it checks
the path's earlier tokens against what was really emitted): it is then a proposal for the real context like
any other, so verification keeps the output exactly the target's. Which paths get used depends on the
target's past choices and the path's earlier tokens, never on the token's own value given c.

No grpc here: ``drafter_service.servicer`` streams what ``AheadPath`` drafts.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from drafter_service.guesses import common_prefix
from tandem.errors import InvalidInput
from tandem.types import DraftToken, SamplingParams

MAX_AHEAD = 64                      # the most tokens a gateway may ask to be kept drafted
FIRST_CHUNK = 1                     # tokens drafted by the first call after a new path: out as soon as possible
CHUNK = 2                           # then up to this many a call (fewer Python round trips; a sync waits at most one)
MAX_CHUNK = 8                       # ... or half the path held, up to this: far ahead, fewer messages for the gateway's
                                    # cores (during a prompt's prefill a node drafts 64 tokens ahead)


@dataclass(frozen=True)
class Chunk:
    """Tokens drafted continuing path ``path_id`` at sequence position ``position``."""

    path_id: int
    position: int
    tokens: tuple[DraftToken, ...]
    compute_ms: float
    last: bool = False          # nothing more for this context until the next sync (an empty chunk is last too)


class AheadPath:
    """The real context and the path drafted beyond it for one session of ``drafter`` (a
    ``drafter_service.drafter.Drafter``). ``sync`` (from the stream's reader) and ``draft`` (from a worker
    thread) may run at the same time: state changes happen under a lock, the drafting outside it."""

    def __init__(self, drafter, session_id: str, token: str, sampling: SamplingParams):
        self.drafter, self.session_id, self.token, self.sampling = drafter, session_id, token, sampling
        # A model-free drafter (suffix drafting) copies its path from text: a call costs about the same for one
        # token or for all it has, so it drafts once a sync, everything it offers, in one chunk marked last.
        info = getattr(drafter, "info", None)
        self._copies = bool(getattr(info, "model_free", False))
        self.context: list[int] = []            # the real context, as the gateway sent it
        self.path: list[DraftToken] = []        # drafted beyond it
        self.path_id = 0
        self.ahead = 0
        self._stalled = False                   # the drafter offered nothing more for this context (its end,
                                                # or a drafter with nothing to propose): wait for the next sync
        self._seen: list[int] = []              # the context the drafter's session last drafted from
        self._drafting: list[int] | None = None  # the context (real + path) of the chunk being drafted
        self._lock = threading.Lock()

    # ---- what the gateway says ----------------------------------------------------------------
    def sync(self, position: int, appended: list[int], ahead: int) -> None:
        """The real context is its first ``position`` tokens + ``appended``; keep ``ahead`` tokens drafted.
        Keeps the path where the new context runs along it, else starts a new one."""
        if not 0 <= ahead <= MAX_AHEAD:
            raise InvalidInput(f"ahead must be between 0 and {MAX_AHEAD}, got {ahead}")
        with self._lock:
            if not 0 <= position <= len(self.context):
                raise InvalidInput(f"position {position} is outside the {len(self.context)} tokens of context "
                                   "sent so far")
            appended = [int(t) for t in appended]
            context = self.context[:position] + appended
            if not context:
                raise InvalidInput("empty context: the first message carries the prompt")
            # the new context runs along the path: its drafted tokens past the new context stay, and what is
            # drafted next still continues the same path (contiguous)
            held = [t.token_id for t in self.path]
            if (position == len(self.context) and len(appended) <= len(held)
                    and appended == held[:len(appended)]):
                self.path = self.path[len(appended):]
            elif (position == len(self.context) and self._drafting == self.context + held
                  and appended[:len(held)] == held):
                self.path = []                  # past the path's end: the chunk in flight decides (``draft``)
            else:
                self.path_id += 1
                self.path = []
            self.context = context
            self.ahead = ahead
            self._stalled = False

    # ---- drafting -----------------------------------------------------------------------------
    def wanted(self) -> int:
        """Tokens to draft now to have ``ahead`` beyond the real context (0: nothing to do)."""
        with self._lock:
            return 0 if self._stalled else max(0, self.ahead - len(self.path))

    def draft(self) -> Chunk | None:
        """Drafts the next tokens of the path (one after a new path, then up to ``CHUNK``, or half the path held
        up to ``MAX_CHUNK``: tokens that far ahead are not needed at once; a model-free drafter,
        once a sync, all it offers up to what is wanted) and appends them;
        returns them (no tokens: the drafter has nothing more to offer for this context until the next sync),
        or None when a sync moved the path meanwhile (the tokens are then void) or there was nothing to draft."""
        with self._lock:
            n = 0 if self._stalled else self.ahead - len(self.path)
            if n <= 0:
                return None
            if not self._copies:
                n = min(n, FIRST_CHUNK if not self.path else max(CHUNK, min(MAX_CHUNK, len(self.path) // 2)))
            path_id = self.path_id
            real = len(self.context)
            full = self.context + [t.token_id for t in self.path]
            self._drafting = full
        t0 = time.perf_counter()
        prefix = common_prefix(self._seen, full)
        proposal = self.drafter.propose(self.session_id, prefix, full[prefix:], n, self.sampling, 0.0, self.token,
                                        committed=real, stop=lambda: self.path_id != path_id)
        self._seen = full
        ms = (time.perf_counter() - t0) * 1e3
        with self._lock:
            self._drafting = None
            now = self.context + [t.token_id for t in self.path]
            if self.path_id != path_id:
                return None
            if now != full:
                return self._past_the_path(full, now, tuple(proposal.tokens[:n]), ms)
            if not proposal.tokens:
                self._stalled = True                        # e.g. the end of the context: until the next sync
                return Chunk(path_id, len(full), (), ms, True)  # says so: the gateway stops waiting for more
            tokens = tuple(proposal.tokens[:n])
            self.path.extend(tokens)
            # a copier offered all it has for this context; the chunk says so when that was less than wanted
            self._stalled = self._copies
            return Chunk(path_id, len(full), tokens, ms, self._copies and len(tokens) < n)

    def _past_the_path(self, full: list[int], now: list[int], tokens: tuple[DraftToken, ...], ms: float
                       ) -> Chunk | None:
        """A chunk drafted from ``full`` while a sync took the real context along the whole path and past its
        end, to ``now`` (under the lock). Where full + the chunk runs along ``now`` and beyond it, the tokens
        beyond were drafted from the real context: they continue the path, and the chunk goes out whole at its
        own position (the gateway checks its first tokens against what was emitted). Otherwise it is void, and
        the next path starts from the real context."""
        drafted = full + [t.token_id for t in tokens]
        if len(now) > len(full) and len(drafted) >= len(now) and drafted[:len(now)] == now:
            self.path = list(tokens[len(now) - len(full):])
            return Chunk(self.path_id, len(full), tokens, ms)
        self.path_id += 1                       # a new path from the real context (none of this one is usable)
        self.path = []
        return None

    def finish(self) -> None:
        """The stream ends: the drafter follows the real context to its end (what was emitted after the last
        block), so a drafter that learns from text (suffix drafting) learns all of the session's."""
        with self._lock:
            context = list(self.context)
        if context and self._seen:                  # the session exists on the drafter (it drafted for it)
            self.drafter.follow(self.session_id, context, self.token)
