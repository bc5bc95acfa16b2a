"""The draft -> verify loop for one request, top to bottom.

    first = target(prompt)                                  # prefill: the first token is the target's own
    loop:
        x_1..x_m, q = drafter(context, k)                   # proposal, m <= k (synced to the accepted prefix)
        n, y = verifier(x_1..x_m, q)                        # one target forward over m+1 positions
        emit x_1..x_n, y                                    # y: recovered token, or bonus if n == m
    until EOS or max_tokens

Without a drafter (``--no-speculation``, or after the drafter failed mid-request) a round verifies
an empty block: one plain decoding step of the same target through the same verifier.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from gateway.ports import DrafterLostSession, DrafterPort, DrafterUnavailable, VerifierPort
from gateway.tracing import round_attributes
from tandem import telemetry
from tandem.round_record import Round
from tandem.types import Proposal, SamplingParams


@dataclass(frozen=True)
class Request:
    session_id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams
    k: int                               # draft length (the most a round drafts); 0 disables speculation
    eos_token_ids: frozenset[int]
    max_context: int
    trace_context: object = None         # OTel Context of the request's span: parent of prefill and rounds
    min_confidence: float = 0.0          # > 0: the drafter may end a block early (adaptive draft length)


async def generate_rounds(req: Request, verifier: VerifierPort, drafter: DrafterPort | None) -> AsyncIterator[Round]:
    """Yields the prefill (index 0) and then one Round per draft -> verify cycle until done."""
    sequence = list(req.prompt_ids)     # prompt + every emitted token
    drafter_seen = 0                    # len(sequence) when the drafter last saw it
    remaining = req.max_tokens

    t0 = time.perf_counter()
    with telemetry.span("prefill", {"tandem.prompt_tokens": len(req.prompt_ids)}, req.trace_context):
        first, prefill_ms = await verifier.start(req.session_id, req.prompt_ids, req.sampling)
    sequence.append(first)
    remaining -= 1
    yield Round.measured(index=0, tokens=(first,), emitted=1, rejection_position=-1, draft_ms=0.0,
                         verify_ms=prefill_ms, round_ms=(time.perf_counter() - t0) * 1e3)
    done = first in req.eos_token_ids or remaining <= 0

    index = 0
    while not done:
        index += 1
        # The round's span is current during both calls: the drafter's and the verifier's server spans
        # (context carried in gRPC metadata by the OTel interceptors) become its children.
        with telemetry.span("round", None, req.trace_context) as span:
            t0 = time.perf_counter()
            # A round emits at most k+1 tokens: never draft past max_tokens or the context.
            k = min(req.k, remaining - 1, req.max_context - len(sequence) - 1) if drafter is not None else 0
            proposal, fallback = Proposal(()), ""
            if k > 0:
                try:
                    try:
                        proposal = await drafter.propose(req.session_id, drafter_seen, sequence[drafter_seen:], k,
                                                         req.sampling, req.min_confidence)
                    except DrafterLostSession:
                        proposal = await drafter.propose(req.session_id, 0, sequence, k, req.sampling,
                                                         req.min_confidence)
                    drafter_seen = len(sequence)
                except DrafterUnavailable as exc:
                    drafter, fallback = None, f"drafter unavailable: {exc}"
            outcome = await verifier.verify(req.session_id, proposal.tokens)

            draft_ids = proposal.token_ids
            emitted = draft_ids[: outcome.accepted] + [outcome.next_token]
            kept = _cut(emitted, remaining, req.eos_token_ids)
            sequence.extend(kept)
            remaining -= len(kept)
            done = len(kept) < len(emitted) or kept[-1] in req.eos_token_ids or remaining <= 0
            rnd = Round.measured(index=index, tokens=tuple(kept), emitted=len(kept), k=k if proposal.tokens else 0,
                                 proposed=len(draft_ids), accepted=outcome.accepted,
                                 rejection_position=outcome.accepted if outcome.accepted < len(draft_ids) else -1,
                                 bonus=outcome.bonus, lookup_tokens=sum(t.from_lookup for t in proposal.tokens),
                                 draft_ms=proposal.compute_ms, verify_ms=outcome.compute_ms,
                                 round_ms=(time.perf_counter() - t0) * 1e3, fallback_reason=fallback)
            if span.is_recording():
                span.set_attributes(round_attributes(rnd))
        yield rnd


def _cut(tokens: Sequence[int], remaining: int, eos: frozenset[int]) -> list[int]:
    """Keeps at most ``remaining`` tokens, up to and including the first EOS."""
    kept = []
    for tok in tokens[:remaining]:
        kept.append(tok)
        if tok in eos:
            break
    return kept
