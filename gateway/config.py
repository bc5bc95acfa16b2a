"""The gateway's settings (``GatewayConfig``: what its flags set, ``gateway.cli``) and the constants they
choose between."""

from __future__ import annotations

from dataclasses import dataclass

from tandem.types import LookupRule

# --lookup-only: the rule the default drafter node serves (tandem serve-drafter --lookup-ngram 4
# --lookup-min-ngram 1), run and copied by the gateway itself
LOOKUP_ONLY_RULE = LookupRule(max_ngram=4, min_ngram=1, trust_ngram=1)
LOOKUP_ONLY_NAME = "prompt lookup (gateway)"


# How a sampled request without a seed is verified (a seeded one is always coupled, tandem.coupling):
#   coupled    the gateway draws a secret seed for the request and gives it to both nodes: the text is the
#              target's own sample whatever the drafter sends (a drafter can only cost speed);
#   rejection  rejection sampling with random generators: exact only if the drafter reports its true q.
UNSEEDED_SAMPLING = ("coupled", "rejection")


@dataclass
class GatewayConfig:
    draft_length: int = 0                 # 0: auto (chosen every round from measured costs); N: always N
    max_draft_length: int = 8             # --max-draft-length: the longest block auto drafts
    max_copy_length: int = 16             # --max-copy-length: ... beside a model-free node (every block a copy)
    draft_confidence: float = 0.0         # adaptive draft length: the drafter stops below this top probability
    max_pinned_draft_length: int = 32     # the longest block a request may pin (its draft_length)
    max_tokens_limit: int = 4096
    no_speculation: bool = False          # gateway-wide default
    drafter_retry_s: float = 1.0          # first wait before probing a failed drafter again (then doubling)
    drafter_retry_max_s: float = 15.0     # longest wait between probes of a failed drafter
    max_concurrent_requests: int = 64     # more at once are refused (RESOURCE_EXHAUSTED); 0: no limit
    local_lookup: bool = True             # blocks prompt lookup supplies whole are copied here (gateway.rounds)
    draft_ahead: bool = True              # the drafter drafts the next block while the verifier checks this one
    plain_ahead: int = 0                  # tokens kept drafted ahead during plain steps too (0: it only follows)
    drafter_shares_cpus: bool = False     # the drafter runs on the verifier's cores (one box): no drafting ahead,
                                          # and drafting's time counts against every session sharing a forward
    lookup_only: bool = False             # no drafter: blocks prompt lookup supplies, copied here (LOOKUP_ONLY_RULE)
    probe_budget: float = 0.005           # auto: worst-case share of plain throughput spent probing a losing drafter
    max_prompt_tokens: int = 0            # longest prompt in tokens (0: the target's context less one)
    max_request_bytes: int = 2 << 20      # longest request: prompt text (checked before tokenizing), gRPC message
    unseeded_sampling: str = "coupled"    # a sampled request without a seed: UNSEEDED_SAMPLING

    def __post_init__(self):
        if self.unseeded_sampling not in UNSEEDED_SAMPLING:
            raise ValueError(f"--unseeded-sampling must be one of {', '.join(UNSEEDED_SAMPLING)}, "
                             f"got {self.unseeded_sampling!r}")
        if not 1 <= self.max_copy_length <= self.max_pinned_draft_length:
            raise ValueError(f"--max-copy-length must be between 1 and {self.max_pinned_draft_length} tokens, "
                             f"got {self.max_copy_length}")
        if not 0 <= self.plain_ahead <= 64:
            raise ValueError(f"--plain-ahead must be between 0 and 64 tokens, got {self.plain_ahead}")
        if not 0.0 <= self.probe_budget < 1.0:
            raise ValueError(f"--probe-budget must be in [0, 1) (a share of plain throughput), got {self.probe_budget}")
