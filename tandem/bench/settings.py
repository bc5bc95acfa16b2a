"""What every mode of a sitting shares (``Settings``) and the sample each request becomes.

Every request becomes one *sample* (a plain dict, stored as is in the JSON): the client-side
timings (wall time from sending the request to the last streamed chunk, time to the first token),
the tokens, and for gateway modes the gateway's own statistics and round-by-round figures. Each
runner (``gateway_runner``, ``hf_peer``, ``llama_peer``) starts its samples with ``base_sample``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.bench import modes as M
from tandem.bench.workload import Prompt


@dataclass(frozen=True)
class Settings:
    """What every mode shares: the same for baseline, speculative and HF requests."""

    max_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    ignore_eos: bool = False
    timeout_s: float = 600.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def seed_for(self, prompt: Prompt) -> int | None:
        """Sampled runs: one fixed seed per prompt (the same in every repeat and mode)."""
        return None if self.greedy else self.seed + prompt.question_id


def base_sample(mode: M.Mode, prompt: Prompt, repeat: int) -> dict:
    """The fields that name a request: its mode, prompt and repeat."""
    return {"mode": mode.name, "question_id": prompt.question_id, "category": prompt.category, "repeat": repeat}
