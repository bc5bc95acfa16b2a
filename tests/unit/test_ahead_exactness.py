"""Blocks drafted ahead keep speculative sampling exact: the chi-square test of tests/unit/test_exactness.py with
the drafter drafting ahead (drafter_service.ahead, gateway.proposal). The drafter reads the prompt during the
prefill and drafts its continuation; round 1's block is then the path's next token when the first token is
the path's first ("ahead"), else a new path drafted from the real context ("wait"). Both kinds of block occur
often in the N requests, and the first three tokens must follow the target's joint distribution. A second test
draws blocks of the drafter's token followed by the gateway's lookup copy after it (gateway.proposal,
``extend_ready``)."""

import asyncio

import pytest
import torch

from gateway.rounds import Request, generate_rounds
from inprocess import LocalAheadDrafter, LocalVerifier
from tandem.types import SamplingParams
from test_exactness import (ALPHA, COUPLED_N, PROMPT, SAMPLING, chi_square_p, counted_generators, drafter,  # noqa: F401
                            exact_joint, target)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N = 3_000


def draw_ahead(target, drafter, n, sampling):
    """Counts of the first three generated tokens over n seeded requests, and of round 1's block sources."""
    verifier, local = LocalVerifier(target), LocalAheadDrafter(drafter)

    async def run():
        counts, sources = {}, {}
        for i in range(n):
            req = Request(f"a{i}", PROMPT, 3, SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p,
                                                             seed=i), 1, frozenset(), 256)
            tokens = []
            async for rnd in generate_rounds(req, verifier, local):
                tokens.extend(rnd.tokens)
                if rnd.index == 1:
                    sources[rnd.source] = sources.get(rnd.source, 0) + 1
            counts[tuple(tokens[:3])] = counts.get(tuple(tokens[:3]), 0) + 1
            await verifier.end(req.session_id)
        return counts, sources

    return asyncio.run(run())


def test_blocks_drafted_ahead_keep_the_target_distribution(target, drafter):
    counts, sources = draw_ahead(target, drafter, N, SAMPLING)
    assert sources.get("ahead", 0) > N // 20 and sources.get("wait", 0) > N // 20, sources
    assert chi_square_p(counts, exact_joint(target, SAMPLING), N) > ALPHA


class ShortLead:
    """A drafting-ahead stream (tests/inprocess.LocalAhead) whose drafter is never more than ``lead`` tokens
    ahead of the sequence, as a slow drafter box is: a round that wants more than that gets the gateway's
    lookup copy after them (gateway.proposal ``extend_ready``)."""

    def __init__(self, inner, lead):
        self.inner, self.lead = inner, lead

    async def sync(self, sequence, ahead):
        await self.inner.sync(sequence, ahead)

    def usable(self, sequence):
        return self.inner.usable(sequence)[:self.lead]

    async def wait(self, sequence, n, timeout_s):
        return self.usable(sequence)

    async def close(self):
        await self.inner.close()


class ShortLeadDrafter(LocalAheadDrafter):
    def open_ahead(self, session_id, token, sampling):
        return ShortLead(super().open_ahead(session_id, token, sampling), 1)


N_EXTENDED = 2_000
NARROW = SamplingParams(temperature=0.9, top_k=3)   # 81 outcomes of four tokens


class ReadyFirst:
    """A draft-length policy that drafts the whole budget (at most 3) and takes the tokens drafted ahead (with the
    gateway's copy after them) over a copy of the whole block, so blocks drafted ahead + copy are frequent."""

    expects_drafting = True

    def next_k(self, budget, *args, **kwargs):
        from gateway.draft_length.choice import Decision

        return Decision(min(3, budget), float("nan"), float("nan"), float("nan"), (), "pinned", ready=True)

    def observe(self, fig):
        pass


def repeated_prompt(target, start=(20, 25, 8, 51), n=8):
    """``start``, the target's greedy continuation of it, then ``start`` again: the target is likely to repeat
    itself, so what prompt lookup copies after a drafted token is often what the target samples."""
    seq = list(start)
    with torch.inference_mode():
        for _ in range(n):
            seq.append(int(target.model(torch.tensor([seq])).logits[0, -1].argmax()))
    return tuple(seq) + tuple(start)


def exact_joint4(target, sampling, prompt):
    """p(t1, t2, t3, t4) by enumeration over the warped target distribution."""
    from verifier_service.warping import warp

    def dist(seq):
        with torch.inference_mode():
            return warp(target.model(torch.tensor([list(seq)])).logits[0, -1], sampling)

    joint = {}

    def walk(seq, p, depth):
        if depth == 4:
            joint[tuple(seq[len(prompt):])] = p
            return
        d = dist(seq)
        for t in d.nonzero().flatten().tolist():
            walk(seq + (t,), p * float(d[t]), depth + 1)

    walk(tuple(prompt), 1.0, 0)
    return joint


def test_drafted_tokens_followed_by_the_gateways_lookup_copy_keep_the_target_distribution(
        target, tiny_target_export, counted_generators):
    """Blocks of one token drafted ahead + lookup's copy after it (k = 3, 8 tokens a request). Unseeded
    (rejection sampling): the first four tokens follow the target's joint distribution. Seeded (coupled
    sampling): every request's tokens are plain decoding's for its seed. The drafter is the target's own ONNX
    export and the prompt repeats the target's own text, so its token is usually kept and the copies after it
    are verified among the first four tokens, often kept (copies claiming q = 0.5 instead of a point mass fail
    the chi-square test at p ~ 1e-34)."""
    from drafter_service.onnx_drafter import OnnxDrafter
    from tandem.types import LookupRule

    verifier = LocalVerifier(target)
    local = ShortLeadDrafter(OnnxDrafter(tiny_target_export[0], threads=1))
    rule = LookupRule(max_ngram=1, min_ngram=1, trust_ngram=1)
    prompt = repeated_prompt(target)

    async def run(n, seeded, drafter):
        outputs, decided = [], 0
        for i in range(n):
            req = Request(f"x{seeded}{i}", prompt, 8,
                          SamplingParams(NARROW.temperature, NARROW.top_k, seed=i if seeded else None),
                          3 if drafter else 0, frozenset(), 256, lookup=rule)
            tokens = []
            async for rnd in generate_rounds(req, verifier, drafter, ReadyFirst() if drafter else None):
                # the drafter's token kept and a copy after it verified at one of the first four positions
                decided += (rnd.source == "ahead" and rnd.lookup_tokens > 0 and rnd.accepted >= 1
                            and len(tokens) + 1 < 4)
                tokens.extend(rnd.tokens)
            outputs.append(tuple(tokens))
            await verifier.end(req.session_id)
        return outputs, decided

    outputs, decided = asyncio.run(run(N_EXTENDED, False, local))
    assert decided > N_EXTENDED // 10, decided
    counts = {}
    for o in outputs:
        counts[o[:4]] = counts.get(o[:4], 0) + 1
    assert chi_square_p(counts, exact_joint4(target, NARROW, prompt), N_EXTENDED) > ALPHA

    speculative, decided = asyncio.run(run(COUPLED_N, True, local))
    assert decided > COUPLED_N // 10, decided
    assert speculative == asyncio.run(run(COUPLED_N, True, None))[0]
