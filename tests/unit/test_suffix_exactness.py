"""Speculative sampling with suffix blocks keeps the target's distribution exactly, with test_exactness.py's
harness: rejection sampling (unseeded requests) passes the chi-square test of the first three tokens'
joint distribution over N_VARIANT = 2 000 requests (as test_exactness.py's other variants), and coupled sampling (seeded) gives plain decoding's tokens
for every seed.

The drafter is the model-free suffix node in global scope: a request's blocks are the most frequent
continuations of what *earlier* requests emitted (q a point mass), so the proposals depend on the test's
own past samples, never on the current block's target probabilities. The first requests find nothing and
step plainly (empty blocks); later ones draft 1 or 2 tokens a round, accepted or rejected. Asked by Propose,
or followed as gateway/proposal.py follows a model-free node: its path drafted ahead from the prompt on, a
round proposing only what is already there (``follow_paths``).
"""

import asyncio

import pytest

from drafter_service.suffix_drafter import SuffixDrafter
from inprocess import LocalDrafter, LocalVerifier
from test_exactness import (ALPHA, COUPLED_N, N_VARIANT, PROMPT, SAMPLING, chi_square_p,  # noqa: F401 - fixtures too
                            counted_generators, draw, exact_joint, joint_counts, plain_outputs, target)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def suffix_draws(target, n: int, seeded: bool) -> tuple[list, dict, dict]:
    """n requests (k = 2) with a fresh suffix node: outputs, a tally of accepted tokens and rejected blocks,
    and the first rounds' block sizes."""
    tally: dict[str, int] = {}
    sizes: dict[int, int] = {}
    outputs = draw(LocalVerifier(target), LocalDrafter(SuffixDrafter()), n, SAMPLING, k=2, seeded=seeded,
                   tally=tally, block_sizes=sizes, max_tokens=4)
    return outputs, tally, sizes


def followed_draws(target, n: int, seeded: bool) -> tuple[list, dict]:
    """n requests (k = 2) with a fresh suffix node followed by its path: outputs and a tally of the rounds'
    blocks (by source) and of accepted tokens and rejected blocks."""
    from gateway.rounds import Request, generate_rounds
    from inprocess import LocalAheadDrafter
    from tandem.types import SamplingParams

    verifier, node = LocalVerifier(target), LocalAheadDrafter(SuffixDrafter())

    async def run():
        outputs, tally = [], {}
        for i in range(n):
            params = SamplingParams(SAMPLING.temperature, SAMPLING.top_k, SAMPLING.top_p, seed=i if seeded else None)
            req = Request(f"f{i}", PROMPT, 4, params, 2, frozenset(), 256, follow_paths=True)
            tokens = []
            async for rnd in generate_rounds(req, verifier, node):
                tokens.extend(rnd.tokens)
                if rnd.index:
                    tally[rnd.source or "plain"] = tally.get(rnd.source or "plain", 0) + 1
                    tally["accepted"] = tally.get("accepted", 0) + rnd.accepted
                    tally["rejected"] = tally.get("rejected", 0) + (rnd.accepted < rnd.proposed)
            outputs.append(tuple(tokens))
            await verifier.end(req.session_id)
        return outputs, tally

    return asyncio.run(run())


def test_rejection_sampling_with_suffix_blocks_matches_target_distribution(target, counted_generators):
    joint = exact_joint(target, SAMPLING)
    outputs, tally, sizes = suffix_draws(target, N_VARIANT, seeded=False)
    assert sizes.get(0, 0) > 0 and sizes.get(1, 0) + sizes.get(2, 0) > N_VARIANT // 2, sizes     # empty and drafted
    assert tally["accepted"] > N_VARIANT // 10 and tally["rejected"] > N_VARIANT // 10, tally
    p = chi_square_p(joint_counts(outputs), joint, N_VARIANT)
    assert p > ALPHA, f"speculative samples deviate from the target distribution (chi-square p = {p:.2e})"


def test_coupled_sampling_with_suffix_blocks_is_the_targets_own_sample(target):
    outputs, tally, _ = suffix_draws(target, COUPLED_N, seeded=True)
    plain = plain_outputs(target, PROMPT, COUPLED_N)
    differ = [i for i in range(COUPLED_N) if outputs[i] != plain[i]]
    assert not differ, f"seed {differ[0]}: speculative {outputs[differ[0]]} != plain {plain[differ[0]]}"
    assert tally["accepted"] > COUPLED_N // 20 and tally["rejected"] > COUPLED_N // 20, tally



def test_rejection_sampling_with_a_followed_suffix_node_matches_target_distribution(target, counted_generators):
    joint = exact_joint(target, SAMPLING)
    outputs, tally = followed_draws(target, N_VARIANT, seeded=False)
    assert set(tally) <= {"ahead", "plain", "accepted", "rejected"}, tally     # never waited for, never asked
    assert tally.get("ahead", 0) > N_VARIANT // 2 and tally["rejected"] > N_VARIANT // 10, tally
    p = chi_square_p(joint_counts(outputs), joint, N_VARIANT)
    assert p > ALPHA, f"speculative samples deviate from the target distribution (chi-square p = {p:.2e})"


def test_coupled_sampling_with_a_followed_suffix_node_is_the_targets_own_sample(target):
    outputs, tally = followed_draws(target, COUPLED_N, seeded=True)
    plain = plain_outputs(target, PROMPT, COUPLED_N)
    differ = [i for i in range(COUPLED_N) if outputs[i] != plain[i]]
    assert not differ, f"seed {differ[0]}: speculative {outputs[differ[0]]} != plain {plain[differ[0]]}"
    assert tally.get("ahead", 0) > COUPLED_N // 4 and tally["accepted"] > COUPLED_N // 20, tally
