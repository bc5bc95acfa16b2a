"""Warping and sampling in numpy (no torch): what the drafter samples from is what it reports.

Warping order (same as the verifier's, see ``tandem.types.SamplingParams``):

1. temperature: ``logits / temperature`` (temperature 0 = greedy, handled by the caller; ``warp``
   returns a one-hot at the argmax then);
2. top-k (``top_k > 0``): keep the tokens whose logit is >= the k-th largest logit (ties at the
   boundary are kept, like ``torch.topk``-threshold warpers);
3. top-p (``top_p < 1``): sort by probability (descending, ties by lower id first), keep each
   token whose *exclusive* cumulative probability (mass of the tokens before it) is < top_p,
   i.e. the smallest prefix whose mass reaches top_p; the most likely token is always kept;
4. softmax over what is kept (everything else has probability 0).

Exactness does not depend on the drafter's warping matching the verifier's bit for bit. Unseeded
(rejection sampling), the verifier accepts x with min(1, p(x)/q(x)) using the q the drafter *reports*,
so any q is exact as long as it is the distribution the token was really drawn from:
``truncate_support`` + ``sample_index`` make that guarantee (the drafter samples from the float32
vector it sends). Seeded (coupled sampling, ``coupled_draft``), the drafter proposes the argmax of
l/T + g over its reported support with the noise g the verifier's own sample uses (tandem.coupling);
the verifier ignores q. Matching warps only raise acceptance.
"""

from __future__ import annotations

import numpy as np

from tandem.coupling import coupled_index
from tandem.draft_checks import MIN_DRAWN_Q
from tandem.types import SamplingParams

# For top-p over a large vocabulary, first look at this many most likely tokens; if they already
# reach top_p the full sort is skipped (the result is identical).
_TOP_P_CANDIDATES = 1024


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax in float64; -inf entries get probability 0."""
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def top_probability(logits: np.ndarray, top: int) -> float:
    """softmax(logits)[top] for the argmax ``top``: 1 / sum(exp(logits - logits[top]))."""
    return 1.0 / float(np.exp(logits - logits[top]).sum())


def _top_p_keep(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Indices of the smallest most-likely set whose mass reaches top_p (at least one)."""
    n = probs.shape[0]
    if n > 2 * _TOP_P_CANDIDATES:
        cand = np.argpartition(-probs, _TOP_P_CANDIDATES)[:_TOP_P_CANDIDATES]
        order = cand[np.lexsort((cand, -probs[cand]))]  # descending prob, ties by lower id
        cum = np.cumsum(probs[order])
        if cum[-1] < top_p:  # the candidates do not reach top_p: sort everything
            order = np.lexsort((np.arange(n), -probs))
            cum = np.cumsum(probs[order])
    else:
        order = np.lexsort((np.arange(n), -probs))
        cum = np.cumsum(probs[order])
    exclusive = cum - probs[order]
    keep = exclusive < top_p
    keep[0] = True
    return order[keep]


def warp(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Probabilities (float64, shape [V]) after temperature, top-k, top-p and softmax."""
    logits = np.asarray(logits)
    if logits.ndim != 1 or logits.shape[0] == 0:
        raise ValueError(f"warp expects a non-empty 1-D logits vector, got shape {logits.shape}")
    if params.greedy:
        out = np.zeros(logits.shape[0], dtype=np.float64)
        out[int(np.argmax(logits))] = 1.0
        return out
    x = logits.astype(np.float64) / float(params.temperature)
    n = x.shape[0]
    if 0 < params.top_k < n:
        kth = np.partition(x, n - params.top_k)[n - params.top_k]
        x = np.where(x >= kth, x, -np.inf)
    probs = softmax(x)
    if params.top_p < 1.0:
        kept = _top_p_keep(probs, params.top_p)
        out = np.zeros_like(probs)
        out[kept] = probs[kept]
        probs = out / out.sum()
    return probs


def truncate_support(probs: np.ndarray, support_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``support_size`` most likely tokens, renormalised: (ids int64, probs float32).

    Ordered by decreasing probability; zero-probability tokens are never included, so the support
    may be smaller. ``support_size`` <= 0 keeps every token with non-zero probability. The drafter
    samples from exactly this (ids, probs) pair and reports it as q.
    """
    probs = np.asarray(probs, dtype=np.float64)
    nonzero = int(np.count_nonzero(probs > 0))
    if nonzero == 0:
        raise ValueError("cannot truncate an all-zero distribution")
    size = nonzero if support_size <= 0 else min(support_size, nonzero)
    if size < probs.shape[0]:
        cand = np.argpartition(-probs, size - 1)[:size]
    else:
        cand = np.arange(probs.shape[0])
    ids = cand[np.lexsort((cand, -probs[cand]))].astype(np.int64)
    p = probs[ids]
    return ids, (p / p.sum()).astype(np.float32)


def sample_index(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draws an index with probability proportional to ``probs`` (exactly these values).

    Inverse-CDF in float64 over the given vector, so float32 probabilities that do not sum to
    exactly 1 are sampled as reported (renormalised by their sum); never picks a zero entry.
    """
    cum = np.cumsum(np.asarray(probs, dtype=np.float64))
    u = rng.random() * cum[-1]
    return min(int(np.searchsorted(cum, u, side="right")), cum.shape[0] - 1)


def coupled_draft(logits: np.ndarray, ids: np.ndarray, probs: np.ndarray, sampling: SamplingParams, position: int,
                  draft_vocab: np.ndarray | None = None) -> int:
    """The coupled draft at sequence ``position``: the index into the support (``ids``: logit indices,
    ``probs``: q on them, from ``truncate_support``) maximising l/T + g(seed, position, target id). Tokens
    whose reported q is below ``MIN_DRAWN_Q`` are left out, so the block passes the checks of q whoever
    applies them. ``draft_vocab`` maps logit indices to target ids (None: the same)."""
    keep = np.flatnonzero(np.asarray(probs) >= MIN_DRAWN_Q)     # never empty: the top token has q >= 1/support
    kept = np.asarray(ids)[keep]
    scores = np.asarray(logits)[kept].astype(np.float64) / float(sampling.temperature)
    target_ids = kept if draft_vocab is None else draft_vocab[kept]
    return int(keep[coupled_index(scores, target_ids, int(sampling.seed), position)])


def session_rng(seed: int | None) -> np.random.Generator:
    """A session's generator: seeded runs are reproducible, on a stream distinct from ``seed`` itself."""
    if seed is None:
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence()))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), 0xD7AF7])))
