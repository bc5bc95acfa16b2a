"""What a draft block must satisfy before it is verified. Rejection sampling (unseeded sessions) is exact
only if q is the distribution each draft token was really drawn from, so a q that cannot be one is
refused, whoever sent it: the verifier refuses the block (INVALID_ARGUMENT), and the gateway, which checks
the drafter's proposal with the same rule first, falls back to the target alone for the request.
Refusing depends only on the proposal, never on the target's probabilities, so the fallback stays exact.

What a claim of q can still do: no check tells a lie from a rare draw, so under rejection sampling a
drafter that claims q(x) = MIN_DRAWN_Q for a token it did not draw has x accepted wherever the target's
p(x) >= q(x), raising x's share of the output without bound. It can never make the verifier emit a token
with p(x) = 0 (accepted with probability min(1, p/q) = 0; recovered tokens come from max(p - q, 0)).
Coupled sessions (seeded, verifier_service.acceptance.accept_coupled) never read q: every emitted token is
the target's own sample, so any claim costs acceptance only. Their q is checked all the same.

For each draft position i of a block (greedy sessions need only the ids):
  - the token id and every support id lie in the target's vocabulary; support ids are unique;
  - probabilities are finite, in [0, 1], and sum to at most 1 + 1e-4;
  - sampled sessions: the drafted token is in its support with q(x) >= MIN_DRAWN_Q (a token drawn from q
    has q(x) > 0, and one with q(x) below 1e-6 is drawn once in a million drafts; accepting with
    min(1, p/q) for q(x) ~ 0 would force any token into the output).
And the block is no longer than the session's configured maximum draft length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tandem.errors import CapacityExceeded, InvalidInput
from tandem.types import DraftToken

Q_SUM_TOLERANCE = 1e-4
MIN_DRAWN_Q = 1e-6


def check_ids(ids: Sequence[int], vocab_size: int, what: str) -> None:
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise InvalidInput(f"{what} has token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")


def check_draft(draft: Sequence[DraftToken], vocab_size: int, sampled: bool, max_block: int) -> None:
    """Raises InvalidInput (or CapacityExceeded for a block past ``max_block``) for a block that cannot be
    verified exactly."""
    if len(draft) > max_block:
        raise CapacityExceeded(f"the draft block has {len(draft)} tokens; this session allows at most {max_block}")
    check_ids([t.token_id for t in draft], vocab_size, "the draft block")
    for i, tok in enumerate(draft):
        ids, probs = tok.support_ids, tok.support_probs
        if len(ids) != len(probs):
            raise InvalidInput(f"draft position {i}: {len(ids)} support ids but {len(probs)} probabilities")
        check_ids(ids, vocab_size, f"draft position {i} support")
        if len(set(ids)) != len(ids):
            raise InvalidInput(f"draft position {i}: support ids repeat")
        if any(not (math.isfinite(q) and 0.0 <= q <= 1.0) for q in probs):
            raise InvalidInput(f"draft position {i}: probabilities must be finite and lie in [0, 1]")
        if math.fsum(probs) > 1.0 + Q_SUM_TOLERANCE:
            raise InvalidInput(f"draft position {i}: probabilities sum to {math.fsum(probs):.6g} > 1")
        if sampled:
            if not ids:
                raise InvalidInput(f"draft position {i}: a sampled session needs the draft distribution q "
                                   "(support ids and probabilities) for exact verification")
            if tok.token_id not in ids:
                raise InvalidInput(f"draft position {i}: token {tok.token_id} is outside its own support")
            q = probs[ids.index(tok.token_id)]
            if q < MIN_DRAWN_Q:
                raise InvalidInput(f"draft position {i}: q({tok.token_id}) = {q:.3g}: a token this unlikely under q "
                                   "was not drawn from it")
