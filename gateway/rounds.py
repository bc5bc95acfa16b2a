"""The draft -> verify loop for one request, top to bottom.

    first = target(prompt)                                  # prefill: the first token is the target's own
    loop:
        k = policy(past rounds' costs and acceptance)       # 0 = a plain step (gateway.draft_length)
        x_1..x_m, q = drafter(context, k)                   # proposal, m <= k (synced to the accepted prefix);
                                                            # prompt lookup's copy if it supplies all k
                                                            # (Request.local_lookup: no drafter call)
        n, y = verifier(x_1..x_m, q)                        # one target forward over m+1 positions
        emit x_1..x_n, y                                    # y: recovered token, or bonus if n == m
    until EOS or max_tokens

Without a drafter (``--no-speculation``, or after the drafter failed mid-request) a round verifies
an empty block: one plain decoding step of the same target through the same verifier. Whatever the
drafter sends is checked before it reaches the verifier (``check_proposal``): a drafter that fails or
misbehaves in any way costs speed, never the request.

Prompt lookup at the gateway: the drafter reports its lookup rule (``Request.lookup``, from its GetInfo),
and the gateway runs the same rule over the sequence it holds, to predict what lookup will copy (the
choice of k counts on it) and, with ``Request.local_lookup`` (on by default), to copy a block that the
rule supplies whole and the drafter would not check (an n-gram of at least its ``trust_ngram``): the
drafter would return exactly these tokens without running its model, so the gateway proposes them itself
and the round saves the drafter's round trip (~1.3 ms of a 6 ms plain step on loopback on the 2-core
AMD EPYC; a network round trip between two machines). The tokens are a deterministic function of the
context with q a point mass, as the drafter reports them: verification stays exact. The drafter catches
up on them with its next call.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from gateway.draft_length import DraftLengthPolicy, RoundFigures
from gateway.ports import DrafterLostSession, DrafterPort, DrafterUnavailable, VerifierPort
from gateway.tracing import round_attributes
from tandem import telemetry
from tandem.draft_checks import check_draft
from tandem.errors import CapacityExceeded, InvalidInput
from tandem.lookup import LookupIndex, lookup_proposal
from tandem.round_record import Round
from tandem.types import LookupRule, Proposal, SamplingParams


@dataclass(frozen=True)
class Request:
    session_id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams
    k: int                               # the most a round drafts; 0 disables speculation
    eos_token_ids: frozenset[int]
    max_context: int
    vocab_size: int = 0                  # the target's: drafted ids must lie in [0, vocab_size) (0: unchecked)
    trace_context: object = None         # OTel Context of the request's span: parent of prefill and rounds
    min_confidence: float = 0.0          # > 0: the drafter may end a block early (adaptive draft length)
    verifier_token: str = ""             # the session's secrets on each node (never the same: the drafter
    drafter_token: str = ""              # must not be able to act on the verifier's session)
    lookup: LookupRule | None = None     # the drafter's prompt lookup (its GetInfo): predicted with its rule
    local_lookup: bool = True            # a block that rule supplies whole, unchecked, is copied here


def check_proposal(proposal: Proposal, k: int, vocab_size: int, sampled: bool) -> None:
    """Raises DrafterUnavailable when a proposal cannot be verified as is (more than k tokens, ids outside
    the target's vocabulary, a q that cannot be the one the tokens were drawn from: tandem.draft_checks)."""
    if not math.isfinite(proposal.compute_ms):
        raise DrafterUnavailable(f"drafter reported compute_ms {proposal.compute_ms}")
    try:
        check_draft(proposal.tokens, vocab_size or 2**31 - 1, sampled, max_block=k)
    except (InvalidInput, CapacityExceeded) as exc:
        raise DrafterUnavailable(f"drafter sent an unusable proposal: {exc}") from exc


async def generate_rounds(req: Request, verifier: VerifierPort, drafter: DrafterPort | None,
                          policy: DraftLengthPolicy | None = None) -> AsyncIterator[Round]:
    """Yields the prefill (index 0) and then one Round per draft -> verify cycle until done. ``policy``
    chooses each round's k (None: always ``req.k``)."""
    sequence = list(req.prompt_ids)     # prompt + every emitted token
    drafter_seen = 0                    # len(sequence) when the drafter last saw it
    rule = req.lookup
    lookup = LookupIndex(rule.max_ngram, rule.min_ngram) if rule is not None and rule.max_ngram > 0 else None
    remaining = req.max_tokens

    t0 = time.perf_counter()
    with telemetry.span("prefill", {"tandem.prompt_tokens": len(req.prompt_ids)}, req.trace_context):
        first, prefill_ms = await verifier.start(req.session_id, req.prompt_ids, req.sampling, req.verifier_token,
                                                 req.k)
    sequence.append(first)
    remaining -= 1
    yield Round.measured(index=0, tokens=(first,), origins=("target",), emitted=1, draft_ms=0.0, verify_ms=prefill_ms,
                         round_ms=(time.perf_counter() - t0) * 1e3)
    done = first in req.eos_token_ids or remaining <= 0

    index = 0
    while not done:
        index += 1
        # The round's span is current during both calls: the drafter's and the verifier's server spans
        # (context carried in gRPC metadata by the OTel interceptors) become its children.
        with telemetry.span("round", None, req.trace_context) as span:
            t0 = time.perf_counter()
            # A round emits at most k+1 tokens: never draft past max_tokens or the context.
            budget = min(req.k, remaining - 1, req.max_context - len(sequence) - 1) if drafter is not None else 0
            decision = None
            # what prompt lookup will copy this round (the drafter's own rule, from its GetInfo): such tokens
            # are nearly free and often accepted, so they change the best k
            looked, ngram = lookup.find(sequence, budget) if budget > 0 and lookup is not None else ([], 0)
            local = req.local_lookup and bool(looked) and rule.copies_unchecked(ngram)
            if policy is not None and drafter is not None:
                decision = policy.next_k(budget, len(looked), ngram, local, behind=len(sequence) - drafter_seen,
                                         remaining=remaining)
            k = decision.k if decision is not None else budget
            proposal, fallback, propose_ms, called = Proposal(()), "", None, False
            if local and 0 < k <= len(looked):
                proposal = Proposal(tuple(lookup_proposal(looked[:k], req.sampling)))
            elif k > 0:
                called = True
                tp = time.perf_counter()
                try:
                    try:
                        proposal = await drafter.propose(req.session_id, drafter_seen, sequence[drafter_seen:], k,
                                                         req.sampling, req.min_confidence, req.drafter_token)
                    except DrafterLostSession:
                        proposal = await drafter.propose(req.session_id, 0, sequence, k, req.sampling,
                                                         req.min_confidence, req.drafter_token)
                    drafter_seen = len(sequence)
                    check_proposal(proposal, k, req.vocab_size, not req.sampling.greedy)
                except DrafterUnavailable as exc:
                    drafter, proposal, fallback = None, Proposal(()), f"drafter unavailable: {exc}"
                propose_ms = (time.perf_counter() - tp) * 1e3
            outcome = await verifier.verify(req.session_id, proposal.tokens, req.verifier_token)
            round_ms = (time.perf_counter() - t0) * 1e3
            if policy is not None and not fallback:      # a failed drafter call says nothing about costs
                policy.observe(RoundFigures.from_outcome(proposal, outcome, round_ms, propose_ms,
                                                         drafter_called=called))

            draft_ids = proposal.token_ids
            emitted = draft_ids[: outcome.accepted] + [outcome.next_token]
            kept = _cut(emitted, remaining, req.eos_token_ids)
            sequence.extend(kept)
            remaining -= len(kept)
            done = len(kept) < len(emitted) or kept[-1] in req.eos_token_ids or remaining <= 0
            rnd = Round.measured(
                index=index, tokens=tuple(kept), emitted=len(kept), k=k if proposal.tokens else 0,
                proposed=len(draft_ids), accepted=outcome.accepted,
                rejection_position=outcome.accepted if outcome.accepted < len(draft_ids) else -1,
                bonus=outcome.bonus, lookup_tokens=sum(t.from_lookup for t in proposal.tokens),
                origins=tuple(_origins(proposal, outcome.accepted, len(kept))),
                draft_ms=proposal.compute_ms, verify_ms=outcome.compute_ms, round_ms=round_ms,
                fallback_reason=fallback, k_reason=decision.reason if decision is not None else "",
                expected_tokens=_finite(decision.expected_tokens) if decision is not None else 0.0,
                expected_tokens_per_ms=_finite(decision.tokens_per_ms) if decision is not None else 0.0)
            if span.is_recording():
                span.set_attributes(round_attributes(rnd))
        yield rnd


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def _origins(proposal: Proposal, accepted: int, kept: int) -> list[str]:
    """Where each emitted token came from: 'lookup' or 'draft' (accepted drafts), then 'target' (the
    recovered or bonus token)."""
    out = ["lookup" if t.from_lookup else "draft" for t in proposal.tokens[:accepted]] + ["target"]
    return out[:kept]


def _cut(tokens: Sequence[int], remaining: int, eos: frozenset[int]) -> list[int]:
    """Keeps at most ``remaining`` tokens, up to and including the first EOS."""
    kept = []
    for tok in tokens[:remaining]:
        kept.append(tok)
        if tok in eos:
            break
    return kept
