"""The draft -> verify loop for one request, top to bottom.

    first = target(prompt)                                  # prefill: the first token is the target's own
    loop:
        k = policy(past rounds' costs and acceptance)       # 0 = a plain step (gateway.draft_length)
        x_1..x_m, q = proposal(context, k)                  # m <= k: a lookup copy, tokens drafted ahead while
                                                            # the last block was verified, or a Propose call
                                                            # (gateway.proposal)
        n, y = verifier(x_1..x_m, q)                        # one target forward over m+1 positions
        emit x_1..x_n, y                                    # y: recovered token, or bonus if n == m
        tell the drafter the new context                    # it drafts the next block meanwhile
    until EOS or max_tokens

Without a drafter (``--no-speculation``, or after the drafter failed mid-request) a round verifies
an empty block: one plain decoding step of the same target through the same verifier. Whatever the
drafter sends is checked before it reaches the verifier (``gateway.proposal.check_proposal``): a drafter
that fails or misbehaves in any way costs speed, never the request.

Prompt lookup at the gateway: the drafter reports its lookup rule (``Request.lookup``, from its GetInfo),
and the gateway runs the same rule over the sequence it holds, to predict what lookup will copy (the
choice of k counts on it) and, with ``Request.local_lookup`` (on by default), to copy a block that the
rule supplies whole and the drafter would not check (an n-gram of at least its ``trust_ngram``): the
drafter would return exactly these tokens without running its model, so the gateway proposes them itself
and the round saves the drafter's round trip. The tokens are a deterministic function of the context with
q a point mass, as the drafter reports them: verification stays exact.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from gateway.draft_length import DraftLengthPolicy, RoundFigures
from gateway.ports import DrafterPort, VerifierPort
from gateway.proposal import Proposer, ProposalStep
from gateway.tracing import round_attributes
from tandem import telemetry
from tandem.lookup import LookupIndex
from tandem.round_record import Round
from tandem.types import LookupRule, Proposal, SamplingParams, VerifyOutcome


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
    draft_ahead: bool = True             # the drafter drafts the next block while the verifier checks this one
    plain_ahead: int = 0                 # and keeps this many tokens drafted while rounds are plain steps
    follow_paths: bool = False           # a model-free node: blocks only from its path, never waited for
    drafter_timeout_s: float = 15.0      # the longest a round waits for drafted tokens
    lookup_only: bool = False            # no drafter: a round drafts only what lookup supplies, copied here
    cache_salt: str = ""                 # the verifier's prefix cache is shared only within one salt


async def generate_rounds(req: Request, verifier: VerifierPort, drafter: DrafterPort | None,
                          policy: DraftLengthPolicy | None = None) -> AsyncIterator[Round]:
    """Yields the prefill (index 0) and then one Round per draft -> verify cycle until done. ``policy``
    chooses each round's k (None: always ``req.k``)."""
    sequence = list(req.prompt_ids)     # prompt + every emitted token
    rule = req.lookup
    lookup = LookupIndex(rule.max_ngram, rule.min_ngram) if rule is not None and rule.max_ngram > 0 else None
    proposer = Proposer(req.session_id, req.drafter_token, req.sampling, drafter, req.vocab_size, req.min_confidence,
                        req.drafter_timeout_s, req.draft_ahead, req.plain_ahead, req.follow_paths)
    remaining = req.max_tokens

    try:
        t0 = time.perf_counter()
        # the first round's room to draft: the drafter reads the prompt during the prefill if it will draft
        first_budget = min(req.k, req.max_tokens - 2, req.max_context - len(sequence) - 2)
        with telemetry.span("prefill", {"tandem.prompt_tokens": len(req.prompt_ids)}, req.trace_context):
            if policy is None or policy.expects_drafting or proposer.plain_ahead or proposer.follows_paths:
                await proposer.start(sequence, first_budget)
            first, prefill_ms = await verifier.start(req.session_id, req.prompt_ids, req.sampling, req.verifier_token,
                                                     req.k, cache_salt=req.cache_salt)
        sequence.append(first)
        remaining -= 1
        yield Round.measured(index=0, tokens=(first,), origins=("target",), emitted=1, draft_ms=0.0,
                             verify_ms=prefill_ms, round_ms=(time.perf_counter() - t0) * 1e3)
        done = first in req.eos_token_ids or remaining <= 0
        ended = time.perf_counter()         # when the last round was handed on (the consumer streams it)

        index = 0
        while not done:
            index += 1
            # The round's span is current during both calls: the drafter's and the verifier's server spans
            # (context carried in gRPC metadata by the OTel interceptors) become its children.
            with telemetry.span("round", None, req.trace_context) as span:
                t0 = time.perf_counter()
                stream_ms = (t0 - ended) * 1e3
                # A round emits at most k+1 tokens: never draft past max_tokens or the context.
                budget = (min(req.k, remaining - 1, req.max_context - len(sequence) - 1)
                          if proposer.drafter is not None or req.lookup_only else 0)
                # what prompt lookup will copy this round (the drafter's own rule, from its GetInfo): such tokens
                # are nearly free and often accepted, so they change the best k
                looked, ngram = lookup.find(sequence, budget) if budget > 0 and lookup is not None else ([], 0)
                local = (req.local_lookup or req.lookup_only) and bool(looked) and rule.copies_unchecked(ngram)
                ready = proposer.ready(sequence) if budget > 0 else ()
                if proposer.drafter is None:
                    budget = len(looked) if local else 0     # no drafter: nothing but a copy can be proposed
                elif proposer.follows_paths:                 # a model-free node: what is here already, or a copy
                    budget = min(budget, max(len(ready), len(looked) if local else 0))
                decision = None
                if policy is not None and (proposer.drafter is not None or req.lookup_only):
                    decision = policy.next_k(budget, len(looked), ngram, local, behind=proposer.behind(sequence),
                                             remaining=remaining, ready=tuple(t.from_lookup for t in ready),
                                             ready_matches=tuple(t.match_length for t in ready))
                k = decision.k if decision is not None else budget
                step = await proposer.propose(sequence, k, looked if local else (),
                                              prefer_ready=decision is not None and decision.ready)
                tv = time.perf_counter()
                outcome = await verifier.verify(req.session_id, step.proposal.tokens, req.verifier_token)
                verify_wall_ms = (time.perf_counter() - tv) * 1e3
                round_ms = (time.perf_counter() - t0) * 1e3
                if policy is not None and not step.fallback:   # a failed drafter call says nothing about costs
                    policy.observe(_figures(step, outcome, round_ms))
                kept = _cut(step.proposal.token_ids[: outcome.accepted] + [outcome.next_token], remaining,
                            req.eos_token_ids)
                sequence.extend(kept)
                remaining -= len(kept)
                done = len(kept) < outcome.accepted + 1 or kept[-1] in req.eos_token_ids or remaining <= 0
                rnd = _record(index, k, step, outcome, kept, round_ms, decision,
                              wire_ms=max(0.0, verify_wall_ms - outcome.compute_ms),
                              gateway_ms=max(0.0, round_ms - verify_wall_ms - (step.wait_ms or 0.0)),
                              stream_ms=stream_ms)
                if span.is_recording():
                    span.set_attributes(round_attributes(rnd))
            if not done:
                await proposer.advance(sequence, k if step.proposal.tokens and step.source != "copy" else 0)
            yield rnd
            ended = time.perf_counter()
    finally:
        await proposer.close(sequence)


def _figures(step: ProposalStep, outcome: VerifyOutcome, round_ms: float) -> RoundFigures:
    """What the draft-length policy learns from a round."""
    return RoundFigures.from_outcome(_timed(step), outcome, round_ms, step.wait_ms,
                                     drafter_called=step.drafter_called)


def _timed(step: ProposalStep):
    """The proposal with the drafter time the round paid: the drafter's compute for a Propose call, the wait
    for streamed tokens, nothing for tokens drafted ahead or copied."""
    if step.source == "wait" and step.wait_ms is not None:
        return Proposal(step.proposal.tokens, step.wait_ms)
    if step.source in ("ahead", "copy"):
        return Proposal(step.proposal.tokens, 0.0)
    return step.proposal


def _record(index: int, k: int, step: ProposalStep, outcome: VerifyOutcome, kept: list[int], round_ms: float,
            decision, **timing: float) -> Round:
    proposal = _timed(step)
    draft_ids = proposal.token_ids
    return Round.measured(
        index=index, tokens=tuple(kept), emitted=len(kept), k=k if draft_ids else 0, proposed=len(draft_ids),
        accepted=outcome.accepted,
        rejection_position=outcome.accepted if outcome.accepted < len(draft_ids) else -1,
        bonus=outcome.bonus, lookup_tokens=sum(t.from_lookup for t in proposal.tokens),
        origins=tuple(_origins(proposal, outcome.accepted, len(kept))), source=step.source,
        draft_ms=proposal.compute_ms, verify_ms=outcome.compute_ms, round_ms=round_ms,
        fallback_reason=step.fallback, k_reason=decision.reason if decision is not None else "",
        expected_tokens=_finite(decision.expected_tokens) if decision is not None else 0.0,
        expected_tokens_per_ms=_finite(decision.tokens_per_ms) if decision is not None else 0.0, **timing)


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def _origins(proposal: Proposal, accepted: int, kept: int) -> list[str]:
    """Where each emitted token came from: accepted drafts by their origin ('draft': the drafter's model;
    'lookup' or 'suffix': copied from text), then 'target' (the recovered or bonus token)."""
    out = [t.origin or ("lookup" if t.from_lookup else "draft") for t in proposal.tokens[:accepted]] + ["target"]
    return out[:kept]


def _cut(tokens: Sequence[int], remaining: int, eos: frozenset[int]) -> list[int]:
    """Keeps at most ``remaining`` tokens, up to and including the first EOS."""
    kept = []
    for tok in tokens[:remaining]:
        kept.append(tok)
        if tok in eos:
            break
    return kept
