"""Speculative sampling reproduces the target's own (warped) distribution exactly.

Tiny random target and a different tiny drafter (vocab 64). With k = 1, the first three generated
tokens cover every path of the rule: token 1 comes from the prefill, token 2 is an accepted draft
or a recovered token, token 3 a bonus token or the next round's draft/recovered token. We draw
N = 20 000 independent requests (seeded, so the test is deterministic) and compare the joint
histogram of (t1, t2, t3) with the exact joint distribution computed from the target
(p(t1) p(t2|t1) p(t3|t1,t2)) by a chi-square test; cells with expected count < 5 are pooled.
False-alarm rate: the test fails when p < 1e-3 (one run in a thousand of a correct sampler).
A control run with a broken rule (every draft accepted, i.e. the drafter's distribution) must
fail the same test, so the test can fail. The test runs with the model drafting, with prompt lookup
on a prompt whose bigram recurs (draft tokens copied from the context, q = point mass), with the
gateway copying every block itself (local lookup: the prompt holds the whole vocabulary, so lookup
always supplies the block and the drafter is never called), with k = 2 and the drafter's confidence
stop (blocks of 1 or 2 tokens, t2 and t3 then both come from the first round), and with k chosen by
auto and by a history-dependent rule.
"""

import asyncio

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from gateway.rounds import Request, generate_rounds
from inprocess import LocalDrafter, LocalVerifier
from tandem.types import SamplingParams, VerifyOutcome
from verifier_service.target import Target
from verifier_service.warping import warp

PROMPT = (1, 5, 9, 14)
N = 20_000
ALPHA = 1e-3
SAMPLING = SamplingParams(temperature=0.9, top_k=6, top_p=0.95)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread (and the test then ignores other load on the machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return Target.load(str(tiny_target_dir))


@pytest.fixture(scope="module")
def drafter(tiny_drafter_onnx):
    from drafter_service.onnx_drafter import OnnxDrafter

    return OnnxDrafter(tiny_drafter_onnx, threads=1)


def exact_joint(target, sampling, prompt=PROMPT) -> dict[tuple[int, int, int], float]:
    """p(t1, t2, t3) by enumeration over the warped target distribution."""
    model = target.model

    def dist(seq):
        with torch.inference_mode():
            return warp(model(torch.tensor([list(seq)])).logits[0, -1], sampling)

    joint = {}
    p1 = dist(prompt)
    for t1 in p1.nonzero().flatten().tolist():
        p2 = dist(prompt + (t1,))
        for t2 in p2.nonzero().flatten().tolist():
            p3 = dist(prompt + (t1, t2))
            for t3 in p3.nonzero().flatten().tolist():
                joint[(t1, t2, t3)] = float(p1[t1] * p2[t2] * p3[t3])
    return joint


def draw(verifier, drafter, n, sampling, k=1, prompt=PROMPT, min_confidence=0.0, block_sizes=None, policy=None,
         lookup=None):
    """Joint counts of the first three generated tokens over n seeded requests; ``block_sizes``
    (a dict) collects how many tokens the first round's proposal had. ``policy()``: a draft-length policy
    per request (auto: k chosen each round from the figures of earlier rounds and requests). ``lookup``: the
    drafter's lookup rule as the gateway knows it (blocks it supplies whole are copied at the gateway)."""
    async def run():
        counts = {}
        for i in range(n):
            req = Request(f"s{i}", prompt, 1 + k + 1, SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p,
                                                                     seed=i),
                          k, frozenset(), 256, min_confidence=min_confidence, lookup=lookup)
            tokens = []
            async for rnd in generate_rounds(req, verifier, drafter, policy() if policy else None):
                tokens.extend(rnd.tokens)
                if rnd.index == 1 and block_sizes is not None:
                    block_sizes[rnd.proposed] = block_sizes.get(rnd.proposed, 0) + 1
            first3 = tuple(tokens[:3])
            counts[first3] = counts.get(first3, 0) + 1
            await verifier.end(req.session_id)
            await drafter.end(req.session_id)
        return counts
    return asyncio.run(run())


def chi_square_p(counts, joint, n) -> float:
    cells = sorted(set(joint) | set(counts))
    expected = np.array([joint.get(c, 0.0) * n for c in cells])
    observed = np.array([counts.get(c, 0) for c in cells], dtype=float)
    if observed[expected == 0].sum() > 0:
        return 0.0          # a sequence the target can never produce
    small = expected < 5
    exp = np.append(expected[~small], expected[small].sum())
    obs = np.append(observed[~small], observed[small].sum())
    if exp[-1] == 0:
        exp, obs = exp[:-1], obs[:-1]
    return float(chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


@pytest.fixture(scope="module")
def lookup_drafter(tiny_drafter_onnx):
    from drafter_service.onnx_drafter import OnnxDrafter

    return OnnxDrafter(tiny_drafter_onnx, threads=1, lookup_max_ngram=2, lookup_min_ngram=1)


def auto_policy():
    """The gateway's auto draft length (costs fixed so only the learned acceptance moves k), its
    acceptance shared across requests as the gateway shares it."""
    from gateway.draft_length import AcceptanceEstimator, AutoDraftLength, CostModel, ProbeRule

    cost, shared = CostModel(), AcceptanceEstimator(alpha=0.05)
    cost.seed({0: 10.0, 1: 10.2, 2: 10.5}, weight=1e9)
    return lambda: AutoDraftLength(cost, AcceptanceEstimator(prior=shared), max_draft_length=2,
                                   probing=ProbeRule(every=2))


def history_policy():
    """An adversarial rule of the same kind: k of each round (1 or 2) from the previous round's outcome,
    across requests. Any k fixed before the block is verified keeps the output exact."""
    from gateway.draft_length import Decision

    seen = {"n": 0}         # speculative rounds so far plus the drafts they accepted, over all requests

    class History:
        def next_k(self, budget, lookup_available=0, lookup_ngram=0, local_lookup=False, behind=0, remaining=0):
            return Decision(min(budget, 1 + seen["n"] % 2), 0.0, 0.0, 0.0, (), "history")

        def observe(self, fig):
            if fig.width:
                seen["n"] += 1 + fig.accepted
    return History


class CountingDrafter(LocalDrafter):
    """Counts Propose calls (local lookup: the gateway copies some blocks without one)."""

    def __init__(self, drafter):
        super().__init__(drafter)
        self.calls = 0

    async def propose(self, *args, **kw):
        self.calls += 1
        return await super().propose(*args, **kw)


@pytest.mark.parametrize("which, prompt", [("model", PROMPT), ("lookup", (5, 9, 14, 5, 9)),
                                           ("local lookup", tuple(range(64)) + (5, 9)),
                                           ("confidence stop", PROMPT), ("auto", PROMPT),
                                           ("history-dependent k", PROMPT)])
def test_speculative_sampling_matches_target_distribution(target, drafter, lookup_drafter, which, prompt):
    """The first three tokens' joint distribution equals the target's exactly. With auto, k differs from
    round to round and request to request, chosen from past rounds only: still exact."""
    joint = exact_joint(target, SAMPLING, prompt)
    assert abs(sum(joint.values()) - 1) < 1e-4
    sizes: dict[int, int] = {}
    k, stop = (2, 0.35) if which in ("confidence stop", "auto", "history-dependent k") else (1, 0.0)
    proposer = CountingDrafter(lookup_drafter if "lookup" in which else drafter)
    counts = draw(LocalVerifier(target), proposer, N,
                  SAMPLING, k=k, prompt=prompt, min_confidence=stop if which == "confidence stop" else 0.0,
                  block_sizes=sizes, policy={"auto": auto_policy, "history-dependent k": history_policy}.get(
                      which, lambda: None)(), lookup=lookup_drafter.info.lookup if which == "local lookup" else None)
    assert sum(counts.values()) == N
    if which == "local lookup":         # every token of the vocabulary is in the prompt: lookup always finds the
        assert proposer.calls == 0      # block (the token after the last one's earlier occurrence), copied here
    if which == "confidence stop":      # both block lengths really occur
        assert sizes.get(1, 0) > N // 20 and sizes.get(2, 0) > N // 20, sizes
    if which == "history-dependent k":  # the choice really varies from request to request
        assert sizes.get(1, 0) > N // 20 and sizes.get(2, 0) > N // 20, sizes
    # The drafter really disagrees with the target: the test exercises rejections and bonus tokens.
    p = chi_square_p(counts, joint, N)
    assert p > ALPHA, f"speculative samples deviate from the target distribution (chi-square p = {p:.2e})"


class AlwaysAccept(LocalVerifier):
    """A broken verifier: keeps every draft token (the bug the test must catch)."""

    async def verify(self, session_id, draft, token=""):
        out = self.target.verify(session_id, [])        # advances the target by one token
        if not draft:
            return out
        session = self.target.sessions.get(session_id)
        session.pending_token = draft[0].token_id
        return VerifyOutcome(0, draft[0].token_id, False)


def test_control_broken_rule_fails_the_same_test(target, drafter):
    joint = exact_joint(target, SAMPLING)
    counts = draw(AlwaysAccept(target), LocalDrafter(drafter), 4000, SAMPLING)
    assert chi_square_p(counts, joint, 4000) < ALPHA
