"""Speculative sampling reproduces the target's own (warped) distribution exactly, under both rules.

Tiny random target and a different tiny drafter (vocab 64). With k = 1, the first three generated
tokens cover every path of the rule: token 1 comes from the prefill, token 2 is an accepted draft
or a recovered token, token 3 a bonus token or the next round's draft/recovered token.

Rejection sampling (unseeded requests): we draw N = 5 000 independent requests (1 200 for each variant past the first; their generators
seeded from a counter, so the test is deterministic) and compare the joint histogram of (t1, t2, t3)
with the exact joint distribution computed from the target (p(t1) p(t2|t1) p(t3|t1,t2)) by a
chi-square test; cells with expected count < 5 are pooled. False-alarm rate: the test fails when
p < 1e-3 (one run in a thousand of a correct sampler). A control run with a broken rule (every draft
accepted, i.e. the drafter's distribution) must fail the same test, so the test can fail.

Coupled sampling (seeded requests, tandem.coupling): the target's own coupled sampler passes the same
chi-square test over N seeds (a control with noise that ignores the position must fail it), and every
speculative request's tokens equal plain decoding's for the same seed, token for token; together the
speculative output is the target's distribution exactly. A drafter that always proposes one token with
a false q = 2e-6 leaves coupled output unchanged and biases rejection sampling's.

Each rule runs with the model drafting, with prompt lookup on a prompt whose bigram recurs (draft
tokens copied from the context, q = point mass), with the gateway copying every block itself (local
lookup: the prompt holds the whole vocabulary, so lookup always supplies the block and the drafter is
never called), with k = 2 and the drafter's confidence stop (blocks of 1 or 2 tokens, t2 and t3 then
both come from the first round), and with k chosen by auto and by a history-dependent rule.
"""

import asyncio
import collections
import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from gateway.rounds import Request, generate_rounds
from inprocess import LocalDrafter, LocalVerifier
from tandem.types import DraftToken, Proposal, SamplingParams, VerifyOutcome
from verifier_service.acceptance import coupled_sample
from verifier_service.target import Target
from verifier_service.warping import warp

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = (1, 5, 9, 14)
N = 5_000                # requests of the plain rule's test (the "model" variant)
N_VARIANT = 1_200        # requests of each other variant: a path that biased the rule shows at this size too
                         # (the broken-rule control fails at 2 000)
ALPHA = 1e-3
SAMPLING = SamplingParams(temperature=0.9, top_k=6, top_p=0.95)


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
         lookup=None, seeded=True, max_tokens=None, tally=None) -> list[tuple[int, ...]]:
    """The generated tokens of n requests (request i seeded with i, or unseeded); ``block_sizes`` (a dict)
    collects how many tokens the first round's proposal had, ``tally`` (a dict) the accepted draft tokens
    and rejected blocks. ``policy()``: a draft-length policy per request (auto: k chosen each round from
    the figures of earlier rounds and requests). ``lookup``: the drafter's lookup rule as the gateway knows
    it (blocks it supplies whole are copied at the gateway). ``drafter`` None: plain decoding."""
    async def run():
        outputs = []
        for i in range(n):
            params = SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p, seed=i if seeded else None)
            req = Request(f"s{i}", prompt, max_tokens or 1 + k + 1, params, k if drafter is not None else 0,
                          frozenset(), 256, min_confidence=min_confidence, lookup=lookup)
            tokens = []
            async for rnd in generate_rounds(req, verifier, drafter, policy() if policy else None):
                tokens.extend(rnd.tokens)
                if rnd.index == 1 and block_sizes is not None:
                    block_sizes[rnd.proposed] = block_sizes.get(rnd.proposed, 0) + 1
                if tally is not None and rnd.index:
                    tally["accepted"] = tally.get("accepted", 0) + rnd.accepted
                    tally["rejected"] = tally.get("rejected", 0) + (rnd.accepted < rnd.proposed)
            outputs.append(tuple(tokens))
            await verifier.end(req.session_id)
            if drafter is not None:
                await drafter.end(req.session_id)
        return outputs
    return asyncio.run(run())


def joint_counts(outputs) -> dict[tuple[int, int, int], int]:
    return dict(collections.Counter(o[:3] for o in outputs))


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
        expects_drafting = True

        def next_k(self, budget, lookup_available=0, lookup_ngram=0, local_lookup=False, behind=0, remaining=0,
                   ready=(), ready_matches=()):
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


VARIANTS = [("model", PROMPT), ("lookup", (5, 9, 14, 5, 9)), ("local lookup", tuple(range(64)) + (5, 9)),
            ("confidence stop", PROMPT), ("auto", PROMPT), ("history-dependent k", PROMPT)]
COUPLED_N = 400          # seeded requests per variant, each compared with plain decoding token for token


@pytest.fixture
def counted_generators(monkeypatch):
    """Unseeded sessions seed their generators from the operating system; here from a counter, so that a
    failure of the statistical test reproduces."""
    counter = itertools.count()
    monkeypatch.setattr("verifier_service.target.rejection_generator",
                        lambda: torch.Generator().manual_seed(next(counter)))
    monkeypatch.setattr("drafter_service.drafter.session_rng", lambda seed: np.random.default_rng([next(counter), 7]))


def run_variant(target, drafter, lookup_drafter, which, prompt, n, seeded, tally=None, max_tokens=None):
    """The outputs of n requests of one variant (checking that the variant really did what it is named for)."""
    sizes: dict[int, int] = {}
    k, stop = (2, 0.35) if which in ("confidence stop", "auto", "history-dependent k") else (1, 0.0)
    proposer = CountingDrafter(lookup_drafter if "lookup" in which else drafter)
    outputs = draw(LocalVerifier(target), proposer, n,
                   SAMPLING, k=k, prompt=prompt, min_confidence=stop if which == "confidence stop" else 0.0,
                   block_sizes=sizes, policy={"auto": auto_policy, "history-dependent k": history_policy}.get(
                       which, lambda: None)(), lookup=lookup_drafter.info.lookup if which == "local lookup" else None,
                   seeded=seeded, max_tokens=max_tokens, tally=tally)
    if which == "local lookup":         # every token of the vocabulary is in the prompt: lookup always finds the
        assert proposer.calls == 0      # block (the token after the last one's earlier occurrence), copied here
    if which in ("confidence stop", "history-dependent k"):   # both block lengths really occur
        assert sizes.get(1, 0) > n // 20 and sizes.get(2, 0) > n // 20, sizes
    return outputs


@pytest.mark.parametrize("which, prompt", VARIANTS)
def test_rejection_sampling_matches_target_distribution(target, drafter, lookup_drafter, counted_generators,
                                                        which, prompt):
    """Unseeded: the first three tokens' joint distribution equals the target's exactly. With auto, k differs
    from round to round and request to request, chosen from past rounds only: still exact."""
    joint = exact_joint(target, SAMPLING, prompt)
    assert abs(sum(joint.values()) - 1) < 1e-4
    n = N if which == "model" else N_VARIANT
    counts = joint_counts(run_variant(target, drafter, lookup_drafter, which, prompt, n, seeded=False))
    assert sum(counts.values()) == n
    # The drafter really disagrees with the target: the test exercises rejections and bonus tokens.
    p = chi_square_p(counts, joint, n)
    assert p > ALPHA, f"speculative samples deviate from the target distribution (chi-square p = {p:.2e})"


_plain: dict[tuple, list] = {}


def plain_outputs(target, prompt, n, sampling=SAMPLING, max_tokens=4) -> list[tuple[int, ...]]:
    """Plain decoding (no drafter) of requests seeded 0..n-1, through the same verifier."""
    key = (prompt, n, sampling, max_tokens)
    if key not in _plain:
        _plain[key] = draw(LocalVerifier(target), None, n, sampling, prompt=prompt, max_tokens=max_tokens)
    return _plain[key]


@pytest.mark.parametrize("which, prompt", VARIANTS)
def test_coupled_speculative_sampling_is_the_targets_own_sample(target, drafter, lookup_drafter, which, prompt):
    """Seeded: every request's tokens are plain decoding's for the same seed, whatever k, lookup or the
    confidence stop did; the blocks really were partly accepted and partly rejected."""
    tally: dict[str, int] = {}
    outputs = run_variant(target, drafter, lookup_drafter, which, prompt, COUPLED_N, seeded=True, tally=tally,
                          max_tokens=4)
    plain = plain_outputs(target, prompt, COUPLED_N)
    differ = [i for i in range(COUPLED_N) if outputs[i] != plain[i]]
    assert not differ, f"seed {differ[0]}: speculative {outputs[differ[0]]} != plain {plain[differ[0]]}"
    assert tally["accepted"] > COUPLED_N // 20 and tally["rejected"] > COUPLED_N // 20, tally


def coupled_joint_counts(target, sampling, n, prompt=PROMPT, same_noise=False) -> dict[tuple[int, int, int], int]:
    """(t1, t2, t3) of the target's own coupled sampler for seeds 0..n-1 (logits computed once per prefix).
    ``same_noise``: a broken coupling that draws every position's token from the first position's noise."""
    logits: dict[tuple[int, ...], torch.Tensor] = {}

    def row(seq):
        if seq not in logits:
            with torch.inference_mode():
                logits[seq] = target.model(torch.tensor([list(seq)])).logits[0, -1]
        return logits[seq]

    counts: dict[tuple[int, int, int], int] = {}
    for seed in range(n):
        params = SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p, seed=seed)
        seq = tuple(prompt)
        for _ in range(3):
            seq += (coupled_sample(row(seq), params, len(prompt) if same_noise else len(seq)),)
        counts[seq[len(prompt):]] = counts.get(seq[len(prompt):], 0) + 1
    return counts


def test_coupled_sampler_matches_target_distribution(target):
    """The target's coupled sample over N seeds has the target's joint distribution (the same chi-square
    test as rejection sampling's); noise shared between positions fails it, so the test can fail."""
    joint = exact_joint(target, SAMPLING)
    p = chi_square_p(coupled_joint_counts(target, SAMPLING, N), joint, N)
    assert p > ALPHA, f"coupled samples deviate from the target distribution (chi-square p = {p:.2e})"
    broken = chi_square_p(coupled_joint_counts(target, SAMPLING, N, same_noise=True), joint, N)
    assert broken < ALPHA, f"the control (noise shared between positions) passed: p = {broken:.2e}"


class LyingDrafter(LocalDrafter):
    """Always proposes ``token`` and claims it drew it with q = 2e-6 (above the checks' 1e-6 floor), so that
    rejection sampling accepts it with min(1, p / q) = 1 wherever p >= 2e-6."""

    def __init__(self, drafter, token):
        super().__init__(drafter)
        self.token = token

    async def propose(self, session_id, prefix_length, appended_tokens, k, sampling, min_confidence=0.0, token=""):
        return Proposal(tuple(DraftToken(self.token, (self.token,), (2e-6,)) for _ in range(k)))


def test_a_lying_drafter_cannot_bias_coupled_sampling(target, drafter):
    """T = 1, 200 requests, one lie per round. Coupled: every request's tokens are plain decoding's for its
    seed and the second token's shares pass the chi-square test against the target's. Rejection sampling
    trusts q: the lied-about token takes nearly every second position (the threat the coupling removes)."""
    sampling, n = SamplingParams(temperature=1.0), 200
    joint = exact_joint(target, sampling)
    second: dict[int, float] = {}
    for (_, t2, _), p in joint.items():
        second[t2] = second.get(t2, 0.0) + p
    liar = min(second, key=second.get)                   # the token the target emits least often second
    assert second[liar] < 0.05
    lying = LyingDrafter(drafter, liar)
    coupled = draw(LocalVerifier(target), lying, n, sampling, max_tokens=4)
    assert coupled == plain_outputs(target, PROMPT, n, sampling)
    shares = collections.Counter(o[1] for o in coupled)
    p = chi_square_p({(t,): c for t, c in shares.items()}, {(t,): q for t, q in second.items()}, n)
    assert p > ALPHA, f"the second token's shares deviate from the target's (chi-square p = {p:.2e})"
    rejection = draw(LocalVerifier(target), lying, n, sampling, max_tokens=4, seeded=False)
    assert sum(o[1] == liar for o in rejection) > 0.9 * n


class AlwaysAccept(LocalVerifier):
    """A broken verifier: keeps every draft token (the bug the test must catch)."""

    async def verify(self, session_id, draft, token=""):
        out = self.target.verify(session_id, [])        # advances the target by one token
        if not draft:
            return out
        session = self.target.sessions.get(session_id)
        session.pending_token = draft[0].token_id
        return VerifyOutcome(0, draft[0].token_id, False)


def test_control_broken_rule_fails_the_same_test(target, drafter, counted_generators):
    joint = exact_joint(target, SAMPLING)
    counts = joint_counts(draw(AlwaysAccept(target), LocalDrafter(drafter), N_VARIANT, SAMPLING, seeded=False))
    assert chi_square_p(counts, joint, N_VARIANT) < ALPHA
