"""Turning target logits into the warped distribution p the user asked for (torch).

The drafter's numpy twin is ``drafter_service.sampling.warp``; both apply temperature, then
top-k, then top-p (the smallest set of tokens whose probability reaches top_p).
"""

from __future__ import annotations

import torch

from tandem.types import SamplingParams


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
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # exclusive cumulative mass
        drop_sorted = mass_before >= params.top_p                        # keeps >= 1 token
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs
