"""Blocks drafted ahead keep speculative sampling exact: the chi-square test of tests/unit/test_exactness.py with
the drafter drafting ahead (drafter_service.ahead, gateway.proposal). The drafter reads the prompt during the
prefill and drafts its continuation; round 1's block is then the path's next token when the first token is
the path's first ("ahead"), else a new path drafted from the real context ("wait"). Both kinds of block occur
often in the N requests, and the first three tokens must follow the target's joint distribution."""

import asyncio

import pytest

from gateway.rounds import Request, generate_rounds
from inprocess import LocalAheadDrafter, LocalVerifier
from tandem.types import SamplingParams
from test_exactness import ALPHA, PROMPT, SAMPLING, chi_square_p, drafter, exact_joint, target  # noqa: F401

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
