"""The draft length k of every round, chosen from measured costs and acceptance.

Speculation pays in tokens per millisecond, not in acceptance alone (docs/DESIGN.md, "When speculation
pays"). Before each round an automatic policy picks the k in 0..budget that maximises

    E[tokens | k] / E[ms | k]
    E[tokens | k] = 1 + sum_{j=1..k} prod_{i<=j} a_i          (a_i: conditional acceptance of position i)
    E[ms | k]     = t_draft(k) + t_verify(k) + overhead(k)

where k = 0 is a plain decoding step: 1 token for one verify at width 0, with no draft cost and no
round trip to the drafter. The pieces, one module each (plain Python: no grpc, torch or numpy):

- ``figures``: ``RoundFigures``, what a finished round reports;
- ``cost``: ``CostModel``, t_draft, t_verify, the overheads and the drafter's catch-up, per
  verifier + drafter pair;
- ``acceptance``: ``AcceptanceEstimator``, the a_i of model-drafted tokens, of prompt-lookup copies
  per match length, and the lookup yield, per session on top of gateway-wide figures;
- ``choice``: ``choose_k``, the ratio above over every candidate, as a ``Decision``;
- ``probing``: while plain decoding wins, a probe block now and then, within a budget of plain
  throughput, on a schedule shared by the gateway's requests (``ProbeRule``, ``ProbeSchedule``);
- ``policy``: ``DraftLengthPolicy`` (``next_k`` before a round, ``observe`` after it) and its two
  implementations, ``PinnedDraftLength`` and ``AutoDraftLength``.

Exactness (docs/DESIGN.md's rule; Leviathan et al. 2023, Chen et al. 2023). The k of a round is a function
of figures already observed (past rounds' acceptances and timings, the lookup tokens available in the
context) and never of the current block's target probabilities, which are unseen when k is fixed.
So every round is a standard speculative-sampling step with a k fixed before verification: given
everything that happened before it, the tokens it emits are distributed exactly as the target's
continuation of the prefix, whatever k is; by the tower property the whole output has the target's
distribution, unchanged by the adaptive choice. (The same argument covers a drafter that stops a
block early on its own confidence: that uses q, never p.) For greedy decoding any k yields the
target's argmax chain, so the output is token-for-token that of plain decoding.
"""

from gateway.draft_length.acceptance import COPYING_PRIOR_WEIGHT, PRIOR_WEIGHT, AcceptanceEstimator
from gateway.draft_length.choice import Candidate, Decision, choose_k, expected_tokens
from gateway.draft_length.cost import CostModel
from gateway.draft_length.figures import RoundFigures
from gateway.draft_length.policy import AutoDraftLength, DraftLengthPolicy, PinnedDraftLength
from gateway.draft_length.probing import ProbeRule, ProbeSchedule

__all__ = ["PRIOR_WEIGHT", "COPYING_PRIOR_WEIGHT", "RoundFigures", "CostModel", "AcceptanceEstimator", "Candidate",
           "Decision", "choose_k", "expected_tokens", "DraftLengthPolicy", "PinnedDraftLength", "AutoDraftLength",
           "ProbeRule", "ProbeSchedule"]
