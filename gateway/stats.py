"""Per-request statistics, accumulated round by round.

mean acceptance length τ = 1 + accepted / rounds: every round after the prefill counts, plain rounds
(k = 0: no draft, one token) included, so it is 1.00 for plain decoding and the tokens per target
forward when no round is cut short (by EOS or max_tokens). That is Spec-Bench's "mean accepted tokens".
vLLM's "mean acceptance length" is 1 + accepted / drafts: it counts only the rounds that verified a
draft, so where the automatic draft length mixes plain rounds in, vLLM's figure is higher than τ (the
two agree when every round drafts). acceptance rate = accepted / proposed (drafted tokens only).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tandem.round_record import Round


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    proposed_per_position: list[int] = field(default_factory=list)
    ttft_ms: float = 0.0
    total_ms: float = 0.0
    prefill_ms: float = 0.0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    overhead_ms: float = 0.0
    speculative: bool = False
    fallback_reason: str = ""
    draft_model: str = ""
    target_model: str = ""
    round_log: list[Round] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    def add(self, rnd: Round) -> None:
        self.new_tokens += len(rnd.tokens)
        if rnd.index == 0:
            self.prefill_ms = rnd.verify_ms
            self.ttft_ms = (time.perf_counter() - self.started) * 1e3
            return
        self.round_log.append(rnd)
        self.rounds += 1
        self.proposed += rnd.proposed
        self.accepted += rnd.accepted
        for i in range(rnd.proposed):
            if i >= len(self.proposed_per_position):
                self.proposed_per_position.append(0)
                self.accepted_per_position.append(0)
            self.proposed_per_position[i] += 1
            self.accepted_per_position[i] += int(i < rnd.accepted)
        self.draft_ms += rnd.draft_ms
        self.verify_ms += rnd.verify_ms
        self.overhead_ms += rnd.overhead_ms
        if rnd.fallback_reason and not self.fallback_reason:
            self.fallback_reason = rnd.fallback_reason

    def finish(self) -> "RequestStats":
        self.total_ms = (time.perf_counter() - self.started) * 1e3
        return self

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted / rounds, plain rounds included (the module docstring: not vLLM's per-draft figure)."""
        return 1.0 + self.accepted / self.rounds if self.rounds else 1.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / (self.total_ms / 1e3) if self.total_ms > 0 else 0.0
