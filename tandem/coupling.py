"""Drafter-invariant sampling: the noise every random choice of a seeded session is made from.

Coupled sampling (Daliri, Musco, Suresh 2024, "Coupling without communication and drafter-invariant
speculative decoding") with the Gumbel-max trick: the token at sequence position t is

    x_t = argmax over tokens v with p_t(v) > 0 of  log p_t(v) + g(seed, t, v)

where g(seed, t, v) is a standard Gumbel variable that is a pure function of (seed, t, v). Over the seed
x_t is distributed exactly as p_t. The target samples with p, the drafter drafts with its own q and the
same g, and a draft token is accepted iff it equals the target's: the emitted tokens are the target's
own sample for that seed whatever the drafter proposed, and agree with the draft with probability at
least (1 - TV(p, q)) / (1 + TV(p, q)).

Both nodes compute g with this module (numpy only: the drafter node has no torch). Position t is the
token's index in the whole sequence (prompt + generated), which both know. g comes from a counter-based
hash in uint64 integer arithmetic (SplitMix64: the key of (seed, t) is mixed from the seed and t, the
token id is the counter), so the integers are the same bits on every machine; the 53-bit uniform
u = (m + 1/2) / 2^53 lies in (0, 1), and g = -log(-log u) (numpy's log: its last bit may differ between
CPU kinds, which changes a choice only at a tie of two scores within an ulp).

``log p_t(v) = l_t(v) / T - log Z`` on the warped support, so the choice is the argmax of l/T + g over the
support (``scores`` below): no softmax rounding enters it. Over a large support the noise is computed for
the candidates that can win only: a token whose scaled logit is more than ``_NEAR`` below a score already
reached wins only if its g exceeds ``_NEAR``, i.e. its 53-bit integer lies above a fixed threshold, which
one integer comparison decides. The result is the argmax over every token, exactly.
"""

from __future__ import annotations

import math

import numpy as np

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15                 # SplitMix64's counter increment
_MUL1, _MUL2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_DOMAIN = 0x636F75706C656421                # separates this use of a seed from any other
_SMALL = 2048                                # supports up to this size get noise for every token
_NEAR = 6.0                                  # candidates: scaled logit within this of a reached score ...
# ... or noise above _NEAR: m >= _HIGH <=> u >= exp(-exp(-_NEAR)) (2 below the bound: conservative)
_HIGH = max(0, int(math.exp(-math.exp(-_NEAR)) * 2.0 ** 53) - 2)
_SLACK = 1e-6                                # absorbs the rounding of l/T and g in the candidate test


def _mix(x: int) -> int:
    """SplitMix64's finaliser on a Python int (mod 2^64)."""
    x &= _MASK
    x = ((x ^ (x >> 30)) * _MUL1) & _MASK
    x = ((x ^ (x >> 27)) * _MUL2) & _MASK
    return x ^ (x >> 31)


def position_key(seed: int, position: int) -> int:
    """The hash key of (seed, position); every token's noise at that position is drawn from it."""
    if not 0 <= seed <= _MASK:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed}")
    if position < 0:
        raise ValueError(f"position must be >= 0, got {position}")
    return _mix(_mix(seed ^ _DOMAIN) + (position + 1) * _GOLDEN)


def uniform_bits(key: int, ids: np.ndarray) -> np.ndarray:
    """53-bit integers (uint64) of the tokens ``ids`` under ``key``: u = (m + 1/2) / 2^53."""
    x = np.asarray(ids, dtype=np.uint64) + np.uint64(1)
    x *= np.uint64(_GOLDEN)
    x += np.uint64(key)
    x ^= x >> np.uint64(30)
    x *= np.uint64(_MUL1)
    x ^= x >> np.uint64(27)
    x *= np.uint64(_MUL2)
    x ^= x >> np.uint64(31)
    x >>= np.uint64(11)
    return x


def gumbel_of_bits(m: np.ndarray) -> np.ndarray:
    """Standard Gumbel variables (float64) of 53-bit integers from ``uniform_bits``."""
    u = m.astype(np.float64)
    u += 0.5
    u *= 2.0 ** -53
    np.log(u, out=u)
    np.negative(u, out=u)
    np.log(u, out=u)
    np.negative(u, out=u)
    return u


def gumbel(seed: int, position: int, ids) -> np.ndarray:
    """g(seed, position, v) for each token id v in ``ids`` (float64)."""
    return gumbel_of_bits(uniform_bits(position_key(seed, position), np.asarray(ids)))


def coupled_index(scores: np.ndarray, ids: np.ndarray, seed: int, position: int) -> int:
    """The index i maximising scores[i] + g(seed, position, ids[i]) (the first on a tie).

    ``scores``: the scaled logits l/T (float64) of the support's tokens ``ids`` (target token ids, in any
    order). The same (scores, ids) give the same index on every call, whatever the support's size."""
    scores = np.asarray(scores, dtype=np.float64)
    ids = np.asarray(ids)
    if scores.ndim != 1 or scores.shape != ids.shape or scores.shape[0] == 0:
        raise ValueError(f"coupled_index needs matching non-empty 1-D scores and ids, got {scores.shape}, {ids.shape}")
    key = position_key(seed, position)
    if scores.shape[0] <= _SMALL:
        return int(np.argmax(scores + gumbel_of_bits(uniform_bits(key, ids))))
    bits = uniform_bits(key, ids)
    top = int(np.argmax(scores))
    reached = scores[top] + float(gumbel_of_bits(bits[top:top + 1])[0])
    # Any other token scores below `reached` unless it is near the top or its noise exceeds _NEAR.
    cand = np.flatnonzero((scores >= reached - _NEAR - _SLACK) | (bits >= np.uint64(_HIGH)))
    return int(cand[np.argmax(scores[cand] + gumbel_of_bits(bits[cand]))])


def candidates(logits: np.ndarray, temperature: float, key: int, high: int, floor: float) -> tuple[np.ndarray, np.ndarray]:
    """The tokens of a float32 logits row [V] that can still win (``coupled_choice``): (their ids, their 53-bit
    noise integers), ids ascending: scaled logit l/T at least ``floor``, or noise integer at least ``high``.
    The numpy reference of the verifier's C scan (verifier_service/kernels/coupling.c), which is exactly it."""
    bits = uniform_bits(key, np.arange(logits.shape[0]))
    cand = np.flatnonzero((logits.astype(np.float64) / temperature >= floor) | (bits >= np.uint64(high)))
    return cand, bits[cand]


def coupled_choice(logits: np.ndarray, temperature: float, seed: int, position: int, scan=candidates) -> int:
    """``coupled_token`` over every token of a raw float32 logits row [V] at ``temperature``, the same token
    (the same top token, reached score and candidates; see ``coupled_index``), without a float64 copy of the
    row or noise for every token outside the scan: ``scan`` (``candidates``, or the verifier's C kernel with
    its arguments) finds the few tokens that can win in one pass."""
    logits = np.asarray(logits, dtype=np.float32)
    temperature = float(temperature)
    if logits.ndim != 1 or logits.shape[0] <= _SMALL:
        return coupled_token(logits.astype(np.float64) / temperature, None, seed, position)
    key = position_key(seed, position)
    top = int(np.argmax(logits))            # the first top of l/T too: dividing by T > 0 keeps the order
    reached = float(np.float64(logits[top]) / temperature) + float(gumbel_of_bits(uniform_bits(key, np.array([top])))[0])
    ids, bits = scan(logits, temperature, key, _HIGH, reached - _NEAR - _SLACK)
    scores = logits[ids].astype(np.float64) / temperature
    return int(ids[np.argmax(scores + gumbel_of_bits(bits))])


def coupled_token(scaled_logits: np.ndarray, support: np.ndarray | None, seed: int, position: int) -> int:
    """The coupled choice over a full logits row: ``scaled_logits`` [V] (l/T, indexed by token id),
    ``support`` the token ids with p > 0 (None: every token). Returns a token id."""
    scaled_logits = np.asarray(scaled_logits, dtype=np.float64)
    ids = np.arange(scaled_logits.shape[0]) if support is None else np.asarray(support)
    return int(ids[coupled_index(scaled_logits[ids], ids, seed, position)])
