"""The proposal step of a round: where the block the verifier checks comes from.

For a round that drafts k tokens (k chosen by the draft-length policy), in order:

1. a **copy**: prompt lookup over the sequence supplies the whole block with the drafter's own rule, unchecked
   (``Request.lookup``, ``Request.local_lookup``): the gateway copies it itself, no drafter call;
2. **drafted ahead**: the drafter streams a path of tokens drafted beyond the real sequence while the verifier
   checks the previous block (``gateway.clients.AheadStream``; the drafter's side: ``drafter_service.ahead``).
   Tokens drafted from exactly the real context are ready at once ("ahead"); when fewer than k are, the round
   waits for the stream to bring them ("wait"), as long as a Propose call would take;
3. a **Propose** call (drafters without DraftAhead, in-process adapters): the drafter syncs to the sequence it
   is sent (only what it has not seen), drafts, and replies; a drafter that lost the session gets it all again.

A model-free node (suffix drafting: its blocks are copies of text, drafting costs it next to nothing) is
followed differently (``follow_paths``): it is asked to keep as long a path as it can ahead of the sequence
(``AHEAD_MAX``), from the prompt on, plain steps or not, and a round only ever proposes what is already at the
gateway (``ready``): its link and its work are off the critical path entirely. Each copy says how long a
match it stands on, so the choice of k prices a path of text seen before word for word as such. The gateway
syncs it when its path was left or runs short, and in a plain streak every ``COPIER_FOLLOW_EVERY`` tokens.

Whatever the drafter sends is checked before the verifier sees it (``check_proposal``). A drafter that fails or
misbehaves in any way costs speed, never the request: the step reports a fallback, and the request goes on
decoding with the target alone.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.ports import AheadPort, DrafterLostSession, DrafterPort, DrafterUnavailable
from tandem.draft_checks import check_draft
from tandem.errors import CapacityExceeded, InvalidInput
from tandem.lookup import lookup_proposal
from tandem.types import DraftToken, Proposal, SamplingParams

AHEAD_MAX = 64          # the most tokens a stream is asked to keep drafted (the drafter's own bound)
FOLLOW_EVERY = 32       # in a plain streak the drafter is told the new text every this many tokens, not every round
COPIER_FOLLOW_EVERY = 4  # ... a model-free node, whose path is the gateway's only source of its blocks
COPIER_REFILL = 16      # a model-free node's path is synced (and so extended) once fewer tokens are held


def check_proposal(proposal: Proposal, k: int, vocab_size: int, sampled: bool) -> None:
    """Raises DrafterUnavailable when a proposal cannot be verified as is (more than k tokens, ids outside
    the target's vocabulary, a q that cannot be the one the tokens were drawn from: tandem.draft_checks)."""
    if not math.isfinite(proposal.compute_ms):
        raise DrafterUnavailable(f"drafter reported compute_ms {proposal.compute_ms}")
    try:
        check_draft(proposal.tokens, vocab_size or 2**31 - 1, sampled, max_block=k)
    except (InvalidInput, CapacityExceeded) as exc:
        raise DrafterUnavailable(f"drafter sent an unusable proposal: {exc}") from exc


@dataclass(frozen=True)
class ProposalStep:
    """One round's block and how it was had. ``source``: "" (no block: a plain step), "copy", "ahead", "wait"
    or "propose" (see the module docstring). ``wait_ms``: wall time the round spent on the drafter (None: it
    did not ask the drafter). ``fallback``: set when the drafter failed this round (the block is then empty)."""

    proposal: Proposal
    source: str = ""
    wait_ms: float | None = None
    fallback: str = ""

    @property
    def drafter_called(self) -> bool:
        """Whether the round waited on the drafter (a call or the stream): its cost includes the drafter."""
        return self.source in ("wait", "propose")


class Proposer:
    """The proposal step for one request (``propose`` before the verify, ``advance`` after it)."""

    def __init__(self, session_id: str, token: str, sampling: SamplingParams, drafter: DrafterPort | None,
                 vocab_size: int = 0, min_confidence: float = 0.0, timeout_s: float = 15.0, ahead: bool = True,
                 plain_ahead: int = 0, follow_paths: bool = False):
        """``token``: the drafter session's secret; ``vocab_size``: the target's (drafted ids are checked
        against it); ``timeout_s``: the longest a round waits for streamed tokens; ``ahead``: use the drafter's
        DraftAhead stream where it serves one; ``plain_ahead``: tokens it keeps drafted while rounds are plain
        steps (``advance``); ``follow_paths``: a model-free node, followed as the module docstring says."""
        self.session_id, self.token, self.sampling = session_id, token, sampling
        self.drafter = drafter
        self.vocab_size, self.min_confidence, self.timeout_s = vocab_size, min_confidence, timeout_s
        self.plain_ahead = max(0, min(AHEAD_MAX, int(plain_ahead)))
        # the confidence stop is the drafter's, per Propose call: such requests ask with Propose
        self._use_ahead = ahead and not min_confidence and hasattr(drafter, "open_ahead")
        self._follow_paths = follow_paths and self._use_ahead
        self._held = False          # the last ready() found tokens of the path along the sequence
        self._lost = ""             # why the stream of a followed node failed (reported by the next propose)
        self._stream: AheadPort | None = None
        self._seen = 0              # len(sequence) when the drafter last read it (through Propose or the stream)
        self._followed = 0          # len(sequence) at the stream's last message
        self._following = False     # that message asked for nothing drafted (a plain streak)

    @property
    def follows_paths(self) -> bool:
        """Whether the drafter is followed as a model-free node (the module docstring): blocks only from its path."""
        return self._follow_paths and self.drafter is not None

    async def start(self, prompt: Sequence[int], k: int) -> None:
        """Before the prefill: a drafting-ahead drafter reads the prompt and drafts its continuation while the
        verifier prefills, so the first block may be ready when the first token is (if it is the path's)."""
        if not self._use_ahead or self.drafter is None or k <= 0:
            return
        self._stream = self.drafter.open_ahead(self.session_id, self.token, self.sampling)
        if self._stream is None:
            self._use_ahead = self._follow_paths = False
            return
        try:
            await self._stream.sync(prompt, AHEAD_MAX if self._follow_paths else max(_depth(k) + 1, self.plain_ahead))
        except DrafterUnavailable:
            return                  # the first propose reports it (or falls back to Propose)
        self._seen = len(prompt)

    # ---- before the round's choice ----------------------------------------------------------------
    def behind(self, sequence: Sequence[int]) -> int:
        """Context tokens the drafter has not read: it reads them before it drafts."""
        return len(sequence) - self._seen

    def ready(self, sequence: Sequence[int]) -> tuple[DraftToken, ...]:
        """The drafted-ahead tokens a block could propose after ``sequence`` without waiting (each says whether
        it is a copy, and a suffix copy its match length)."""
        if self._stream is None:
            return ()
        try:
            held = tuple(self._stream.usable(sequence))
        except DrafterUnavailable as exc:
            self._stream_failed(exc)
            return ()
        self._held = bool(held)
        return held

    def _stream_failed(self, exc: DrafterUnavailable) -> None:
        """The stream broke: a drafter without DraftAhead is asked with Propose from now on; a followed node's
        failure is reported by the next propose; otherwise the next propose reports it as it asks."""
        from gateway.clients import AheadUnsupported

        if isinstance(exc, AheadUnsupported):
            self._stream, self._use_ahead, self._follow_paths = None, False, False
        elif self._follow_paths:
            self._lost = str(exc)

    # ---- the block ---------------------------------------------------------------------------------
    async def propose(self, sequence: list[int], k: int, copy: Sequence[int] = (), prefer_ready: bool = False
                      ) -> ProposalStep:
        """The round's block of at most k tokens after ``sequence``; ``copy``: lookup tokens the gateway may
        copy itself (a block of k <= len(copy) is copied, unless ``prefer_ready``: the tokens drafted ahead)."""
        if self._lost and self.drafter is not None:     # a followed node's stream failed: the request goes on
            await self.close()                          # without it (a followed node is never asked for more)
            self.drafter = None
            return ProposalStep(Proposal(()), "", 0.0, fallback=f"drafter unavailable: {self._lost}")
        if 0 < k <= len(copy) and not prefer_ready:
            return ProposalStep(Proposal(tuple(lookup_proposal(copy[:k], self.sampling))), "copy")
        if k <= 0 or self.drafter is None:
            return ProposalStep(Proposal(()))
        t0 = time.perf_counter()
        try:
            step = await self._from_stream(sequence, k) if self._use_ahead else None
            if step is None:
                step = ProposalStep(await self._call(sequence, k), "propose")
            check_proposal(step.proposal, k, self.vocab_size, self.sampling.needs_draft_probs)
        except DrafterUnavailable as exc:
            await self.close()
            self.drafter = None
            return ProposalStep(Proposal(()), "", (time.perf_counter() - t0) * 1e3,
                                fallback=f"drafter unavailable: {exc}")
        wait_ms = None if step.source == "ahead" else (time.perf_counter() - t0) * 1e3
        return ProposalStep(step.proposal, step.source, wait_ms)

    async def _from_stream(self, sequence: list[int], k: int) -> ProposalStep | None:
        """The block from the DraftAhead stream (opened at the first block); None: ask with Propose instead."""
        from gateway.clients import AheadUnsupported

        try:
            if self._stream is None:
                self._stream = self.drafter.open_ahead(self.session_id, self.token, self.sampling)
                if self._stream is None:
                    self._use_ahead = False
                    return None
                await self._sync(sequence, _depth(k))
            ready = self._stream.usable(sequence)
            if len(ready) >= k:
                return ProposalStep(Proposal(tuple(ready[:k])), "ahead")
            await self._sync(sequence, _depth(k))             # after a plain streak it was only following
            got = await self._stream.wait(sequence, k, self.timeout_s)
        except AheadUnsupported:
            self._stream, self._use_ahead = None, False
            return None
        return ProposalStep(Proposal(tuple(got[:k])), "wait")   # none: the drafter has nothing to offer here

    async def _call(self, sequence: list[int], k: int) -> Proposal:
        """A Propose call sending what the drafter has not seen (all of it again if it lost the session)."""
        try:
            proposal = await self.drafter.propose(self.session_id, self._seen, sequence[self._seen:], k,
                                                  self.sampling, self.min_confidence, self.token)
        except DrafterLostSession:
            proposal = await self.drafter.propose(self.session_id, 0, sequence, k, self.sampling,
                                                  self.min_confidence, self.token)
        self._seen = len(sequence)
        return proposal

    # ---- after the round ---------------------------------------------------------------------------
    async def advance(self, sequence: list[int], next_k: int) -> None:
        """Tells a drafting-ahead drafter the sequence the round left, and to keep drafted what a round of
        ``next_k`` tokens and the one after it would use.

        After a plain step (``next_k`` 0) it keeps ``plain_ahead`` tokens drafted: its guess of the target's
        next token, then a block after it. When the target's token is that guess, the rest is drafted from the
        real context and ready when the next round begins, at no drafter time: the choice of k sees it
        (``ready``). Without that, a drafted round after a plain step always waits for the drafter. It costs a
        message each way every round on the gateway's cores, so it pays only with a drafter that often guesses
        the target's token (off by default: ``--plain-ahead``). With ``plain_ahead`` 0 it has nothing to draft
        in a plain streak: once told so, it is sent the new text every ``FOLLOW_EVERY`` tokens instead of every
        round (a message a round and session costs both boxes CPU; on one box, the verifier's), and all of it
        when a block is wanted."""
        if self._stream is None:
            return
        if self._follow_paths:
            await self._follow(sequence, next_k > 0)
            return
        depth = _depth(next_k) if next_k > 0 else self.plain_ahead
        if depth <= 0 and self._following and len(sequence) - self._followed < FOLLOW_EVERY:
            return
        try:
            await self._sync(sequence, depth)
        except DrafterUnavailable:
            return                  # the next propose reports it

    async def _follow(self, sequence: Sequence[int], drafted: bool) -> None:
        """A model-free node after a round: synced (asked for ``AHEAD_MAX`` tokens beyond the sequence) after a
        round that drafted or left its path, unless it still holds ``COPIER_REFILL`` tokens along the sequence;
        in a plain streak, every ``COPIER_FOLLOW_EVERY`` tokens (a message each way costs both boxes CPU)."""
        had, self._held = self._held, False
        try:
            held = self._stream.usable(sequence)
        except DrafterUnavailable as exc:
            self._stream_failed(exc)
            return
        if len(held) >= COPIER_REFILL:
            return
        left = had and not held     # the sequence left the path (or ran past its end)
        if not (drafted or left or len(sequence) - self._followed >= COPIER_FOLLOW_EVERY):
            return
        try:
            await self._sync(sequence, AHEAD_MAX)
        except DrafterUnavailable as exc:
            self._stream_failed(exc)

    async def _sync(self, sequence: Sequence[int], depth: int) -> None:
        """Sends the stream ``sequence`` and the tokens to keep drafted beyond it; a drafter asked to draft
        reads it."""
        await self._stream.sync(sequence, depth)
        self._followed, self._following = len(sequence), depth <= 0
        if depth > 0:
            self._seen = len(sequence)

    async def close(self, sequence: Sequence[int] = ()) -> None:
        """Ends the stream, if one is open (and with it the drafter's session), after telling it the request's
        whole ``sequence`` (a drafter that learns from text learns all of it)."""
        stream, self._stream = self._stream, None
        if stream is None:
            return
        if sequence:
            with contextlib.suppress(DrafterUnavailable):
                await stream.sync(sequence, 0)
        await stream.close()


def _depth(k: int) -> int:
    """Tokens to keep drafted beyond the sequence for blocks of k: this round's and, if it is all accepted with
    the path's next token as bonus, the next round's (drafted while the verifier checks this one)."""
    return 0 if k <= 0 else min(AHEAD_MAX, 2 * k + 1)
