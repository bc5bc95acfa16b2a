"""Warm-up and plan: the requests before the timed phase, and which modes fit the time budget.

Warm-up: one untimed request per mode on the prompt whose length is closest to the mean
(``pick_warmup_prompt``); its time, times the requests per mode, is the mode's projected cost.
``auto_unavailable`` reads the auto mode's warm-up request: a gateway that pinned its k, or predates
the automatic draft length, does not run it. ``plan_modes`` keeps modes in priority order
(``modes.priority``) while their projected cost fits the budget.
"""

from __future__ import annotations

import time

from tandem.bench import modes as M
from tandem.bench.settings import Settings
from tandem.bench.workload import Prompt


def pick_warmup_prompt(prompts: list[Prompt]) -> Prompt:
    """The prompt whose length is closest to the mean: its warm-up times project the run's cost."""
    mean = sum(len(p.text) for p in prompts) / len(prompts)
    return min(prompts, key=lambda p: abs(len(p.text) - mean))


def timed_warmup(runner, mode: M.Mode, prompt: Prompt, settings: Settings) -> float:
    """Seconds of one untimed request of ``mode`` on ``prompt``; a failed request raises RuntimeError."""
    t0 = time.perf_counter()
    s = runner.run(mode, prompt, settings)
    if "error" in s:
        raise RuntimeError(f"warm-up request in mode {mode.name} failed: {s['error']}")
    return time.perf_counter() - t0


def auto_unavailable(sample: dict) -> str | None:
    """Why a warm-up request of the auto mode did not run the automatic draft length, or None. A request's
    draft_length 0 means "the gateway's default": a gateway started with ``--draft-length N`` pins N."""
    rounds = sample.get("rounds") or {}
    reasons = [r for r in rounds.get("k_reason", []) if r]
    if "k_reason" not in rounds:
        return ("this gateway reports no k_reason per round (it predates the automatic draft length, "
                "GenerateRequest.draft_length 0 = auto)")
    if reasons and all(r == "pinned" for r in reasons):
        return ("the gateway's default draft length is pinned (started with --draft-length N), so draft_length 0 "
                "is not auto there; start it with --draft-length auto")
    return None


def plan_modes(prioritised: list[M.Mode], warm_s: dict[str, float], n_requests_per_mode: int,
               available_s: float | None, essential: int = 2) -> tuple[list[M.Mode], list[dict], float]:
    """Keeps modes in priority order while their projected time fits ``available_s`` (None: no limit).
    The first ``essential`` modes (groups) are always kept (the baseline and the first speculative mode;
    with auto, also the first fixed k: ``modes.essential``); the HF pair and the llama.cpp pair go
    together."""
    kept, skipped, total = [], [], 0.0
    groups: list[list[M.Mode]] = []
    pairs = {M.HF_ASSISTED: M.HF_PLAIN, M.LLAMA_LOOKUP: M.LLAMA_PLAIN}
    for m in prioritised:
        if m.name in pairs and groups and groups[-1][0].name == pairs[m.name]:
            groups[-1].append(m)
        else:
            groups.append([m])
    for i, group in enumerate(groups):
        cost = sum(warm_s.get(m.name, 0.0) for m in group) * n_requests_per_mode
        essential_group = i < essential
        if essential_group or available_s is None or total + cost <= available_s:
            kept.extend(group)
            total += cost
        else:
            for m in group:
                skipped.append({"mode": m.name, "reason": f"projected {cost / 60:.1f} min, but only "
                                f"{max(0.0, available_s - total) / 60:.1f} min of the time budget are left after the "
                                "modes before it; rerun with --time-budget 0 or a larger one"})
    return kept, skipped, total
