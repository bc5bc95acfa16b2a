"""The exactness rule of speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

Terms (docs/DESIGN.md):
  * draft block: k tokens x_1..x_k proposed by the drafter, x_i drawn from ``draft_probs`` q_i;
  * ``target_probs`` p_i: the target's warped distribution at draft position i (p_{k+1} is the
    distribution after the whole block);
  * accepted: the longest prefix of the block the target keeps;
  * recovered token: emitted at the first rejected position i;
  * bonus token: emitted after a fully accepted block, from p_{k+1}.

Three rules, kept apart on purpose:
  * greedy (temperature 0): accept while x_i == argmax p_i; the recovered token is that argmax, the
    bonus token argmax p_{k+1};
  * coupled (sampled with a seed, ``accept_coupled``): the target's token at each position is its own
    coupled sample (tandem.coupling: Gumbel-max with noise that is a pure function of the seed, the
    position and the token); accept while x_i equals it; the recovered token is the target's sample at
    the first mismatch, the bonus token its sample after the block. q never enters: the emitted tokens
    are the target's own sample for that seed whatever was drafted, so a drafter (honest or not) can only
    cost acceptance;
  * rejection (sampled without a seed, ``accept_random``): accept x_i with probability
    min(1, p_i(x_i) / q_i(x_i)); the recovered token is drawn from norm(max(p_i - q_i, 0)). The emitted tokens are then distributed exactly as if sampled from the
    target alone, provided q_i is the distribution x_i was really drawn from: a drafter that reports a
    false q biases the output (tandem.draft_checks refuses the q that cannot be true, not every lie).

Nothing here knows about sessions, caches or gRPC.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tandem.coupling import candidates, coupled_choice, coupled_token
from tandem.types import SamplingParams
from verifier_service.warping import support


@dataclass(frozen=True)
class Acceptance:
    accepted: int      # number of draft tokens kept (a prefix of the block)
    next_token: int    # recovered token (first rejection) or bonus token (all accepted)
    bonus: bool        # True iff the block was non-empty and fully accepted


def accept_greedy(target_logits: torch.Tensor, draft_ids: Sequence[int]) -> Acceptance:
    """target_logits [k+1, V] (raw), draft_ids [k] -> Acceptance. Deterministic.

    The row maxima by numpy (the first index of the largest value, as torch.argmax): one vectorised pass
    on this thread, where torch's argmax of one 49 k row forks its thread pool (28 against 3 us a row,
    measured; it ran once per session per forward)."""
    k = len(draft_ids)
    target_ids = np.argmax(target_logits.numpy(), axis=-1).tolist()     # [k+1]
    accepted = 0
    while accepted < k and draft_ids[accepted] == target_ids[accepted]:
        accepted += 1
    # Position `accepted` holds the recovered token (mismatch) or the bonus token (all accepted).
    return Acceptance(accepted, int(target_ids[accepted]), bonus=k > 0 and accepted == k)


def accept_random(target_probs: torch.Tensor, draft_ids: Sequence[int], draft_probs: torch.Tensor,
                  generator: torch.Generator) -> Acceptance:
    """Speculative sampling over one block.

    target_probs [k+1, V]: p_1..p_{k+1} (warped, rows sum to 1)
    draft_ids    [k]:      x_1..x_k
    draft_probs  [k, V]:   q_1..q_k, the distributions x_i were drawn from (dense; 0 off-support)
    """
    k = len(draft_ids)
    if k:
        idx = torch.arange(k)
        ids = torch.as_tensor(list(draft_ids), dtype=torch.long)
        p_x = target_probs[idx, ids]                                      # [k]  p_i(x_i)
        q_x = draft_probs[idx, ids]                                       # [k]  q_i(x_i)
        u = torch.rand(k, generator=generator, dtype=torch.float64)       # [k]  one uniform per position
        # accept x_i  <=>  u_i < p_i(x_i) / q_i(x_i)  (<=> u_i * q < p, safe when q == 0)
        accept = (u * q_x.double()) < p_x.double()                        # [k]
        rejected = (~accept).nonzero()
        if len(rejected):
            i = int(rejected[0])
            residual = torch.clamp(target_probs[i] - draft_probs[i], min=0.0)   # [V]  max(p_i - q_i, 0)
            total = residual.sum()
            # total == 0 only if p_i == q_i, where rejection has probability 0; fall back to p_i.
            dist = residual / total if total > 0 else target_probs[i]
            recovered = torch.multinomial(dist, 1, generator=generator)
            return Acceptance(i, int(recovered), bonus=False)
    bonus = torch.multinomial(target_probs[k], 1, generator=generator)     # from p_{k+1}
    return Acceptance(k, int(bonus), bonus=k > 0)


def coupled_sample(logits: torch.Tensor, sampling: SamplingParams, position: int) -> int:
    """The target's coupled sample at sequence ``position`` from one raw logits row [V]: the argmax of
    l/T + g(seed, position, v) over the warped support (tandem.coupling). A pure function of the row, the
    settings and the position, so a verify row bit-identical to a plain step chooses the same token."""
    ids = support(logits, sampling)                                   # [n] ascending (None: every token)
    if ids is None:                     # every token: one scan of the row finds the few that can win
        row = logits.detach().cpu().float().contiguous().numpy()
        return coupled_choice(row, float(sampling.temperature), int(sampling.seed), position, _scan())
    scaled = logits.double().cpu().numpy() / float(sampling.temperature)       # [V] l/T
    return coupled_token(scaled, ids.cpu().numpy(), int(sampling.seed), position)


@functools.cache
def _scan():
    """The C kernels' candidate scan (kernels/coupling.c) where they are built, else numpy's (the same tokens).
    Looked up once: the scan is plain C, the same on every ISA (finding the library costs ~10 us a token)."""
    from verifier_service import native

    kernels = native.library()
    return kernels.coupled_candidates if kernels is not None else candidates


def accept_coupled(target_logits: torch.Tensor, draft_ids: Sequence[int], sampling: SamplingParams,
                   first_position: int) -> Acceptance:
    """Coupled verification of one block: target_logits [k+1, V] (raw), row i predicting the token at
    sequence position ``first_position`` + i. Rows after the first mismatch are never sampled."""
    k = len(draft_ids)
    for i in range(k):
        target_token = coupled_sample(target_logits[i], sampling, first_position + i)
        if int(draft_ids[i]) != target_token:
            return Acceptance(i, target_token, bonus=False)              # the recovered token
    bonus = coupled_sample(target_logits[k], sampling, first_position + k)
    return Acceptance(k, bonus, bonus=k > 0)


def rejection_generator() -> torch.Generator:
    """The generator of an unseeded rejection-sampling session, seeded from the operating system."""
    generator = torch.Generator()
    generator.manual_seed(secrets.randbits(63))
    return generator
