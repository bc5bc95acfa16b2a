"""Turning target logits into the warped distribution p the user asked for (torch).

The drafter's numpy twin is ``drafter_service.sampling.warp``; both apply temperature, then top-k, then
top-p: the smallest most-likely set whose mass reaches top_p, in the order (probability descending,
lower id first on a tie), each token kept while the mass of the tokens before it is below top_p.

Each row is warped on its own, by computations that depend on that row alone, so a row of a verify block
is warped exactly as the same logits in a plain step (the coupled rule relies on it). Top-p first looks at
the tokens above a probability floor (at most 1/floor of them, so a short sort): every other token is
less likely than all of them, so when their mass reaches top_p the kept set lies among them and equals
that of a full sort; otherwise the next floor, then the full sort.
"""

from __future__ import annotations

import torch

from tandem.types import SamplingParams

_TOP_P_FLOORS = (1.0 / 1024, 1.0 / 16384, 0.0)      # 0.0: every token (the full sort)


def _top_p_drop(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs [V] (one row) -> a bool mask [V] of the tokens top-p drops."""
    for floor in _TOP_P_FLOORS:
        ids = torch.nonzero(probs >= floor).flatten()                          # ascending ids
        if not ids.numel():
            continue
        sorted_probs, order = torch.sort(probs[ids], descending=True, stable=True)   # ties: lower id first
        mass = torch.cumsum(sorted_probs, dim=0)       # accumulated in double: a prefix sums the same in any row
        if floor == 0.0 or float(mass[-1]) >= top_p:  # the tokens below the floor come after mass[-1] >= top_p
            break
    mass_before = torch.cat([mass.new_zeros(1), mass[:-1]])                   # exclusive cumulative mass
    kept = mass_before < top_p                                                # always keeps the most likely token
    drop = torch.ones_like(probs, dtype=torch.bool)
    drop[ids[order[kept]]] = False
    return drop


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> probs [..., V] (float32), for temperature > 0."""
    if params.greedy:
        raise ValueError("warp() is for sampling; greedy decoding uses argmax of the raw logits")
    logits = logits.float() / params.temperature                       # [..., V]
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)                               # [..., V]
    if params.top_p < 1.0:
        rows = [row.masked_fill(_top_p_drop(row, params.top_p), 0.0) for row in probs.reshape(-1, vocab)]
        probs = torch.stack([row / row.sum() for row in rows]).reshape(probs.shape)
    return probs


def support(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor | None:
    """The token ids [n] (ascending) of one logits row [V] that ``warp`` keeps with p > 0, or None for every
    token when neither top-k nor top-p is on. (The only tokens ``warp`` then leaves out are those whose
    probability underflows float32, below e^-103 of the top one's: no tandem.coupling noise can make them
    win, so the coupled choice over every token is the same.)"""
    if not (0 < params.top_k < logits.shape[-1]) and params.top_p >= 1.0:
        return None
    return torch.nonzero(warp(logits.unsqueeze(0), params)[0] > 0).flatten()
