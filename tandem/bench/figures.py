"""Figures shared by the bench's sittings (``versus``, ``two_machine``, ``concurrency``): per-prompt
medians over repeats, their mean over prompts, and the per-round breakdown of gateway samples.

A mode's figure = the mean over prompts of the per-prompt median over repeats, taken only over the
prompts every compared mode answered (so a ratio of two figures compares the same prompts)."""

from __future__ import annotations

import statistics
from collections import defaultdict

from tandem.bench.http_stream import decode_figures

METRICS = ("decode_tps", "request_tps", "ttft_ms")


def with_figures(sample: dict) -> dict:
    """The sample with decode_tps, request_tps and ttft_ms filled in (from its chunk timings)."""
    if "error" in sample:
        return sample
    f = decode_figures(sample)
    return dict(sample, decode_tps=f["decode_tps"], request_tps=f["request_tps"], ttft_ms=f["ttft_ms"])


def per_prompt(samples: list[dict], mode: str, metric: str) -> dict[int, float]:
    """question_id -> median over the mode's repeats of ``metric`` (errors and missing values left out)."""
    by_q: dict[int, list[float]] = defaultdict(list)
    for s in samples:
        if s.get("mode") == mode and "error" not in s and s.get(metric) is not None:
            by_q[s["question_id"]].append(s[metric])
    return {q: statistics.median(v) for q, v in by_q.items()}


def common_prompts(samples: list[dict], modes: list[str], metric: str) -> set[int]:
    sets = [set(per_prompt(samples, m, metric)) for m in modes]
    return set.intersection(*sets) if sets else set()


def mode_figure(samples: list[dict], mode: str, metric: str, prompts: set[int] | None = None) -> float | None:
    """Mean over ``prompts`` (default: all the mode answered) of the per-prompt medians."""
    pp = per_prompt(samples, mode, metric)
    xs = [v for q, v in pp.items() if prompts is None or q in prompts]
    return sum(xs) / len(xs) if xs else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def round_breakdown(samples: list[dict], mode: str) -> dict | None:
    """Pooled over the mode's gateway samples: rounds, tokens per round, and mean ms per round of draft,
    verify, overhead (network, serialisation, queuing) and the whole round; ms per token."""
    rounds = tokens = 0
    sums = {"draft_ms": 0.0, "verify_ms": 0.0, "overhead_ms": 0.0, "round_ms": 0.0}
    for s in samples:
        r = s.get("rounds") if s.get("mode") == mode and "error" not in s else None
        if not r or not r.get("round_ms"):
            continue
        # the gateway's round log holds the decode rounds only (the prefill is GenerateStats.prefill_ms)
        n = len(r["round_ms"])
        rounds += n
        tokens += sum(r["emitted"]) if r.get("emitted") else sum(a + 1 for a in r["accepted"])
        for key in sums:
            sums[key] += sum(r[key])
    if not rounds:
        return None
    out = {"rounds": rounds, "tokens": tokens, "tokens_per_round": tokens / rounds}
    out.update({f"{k}_per_round": v / rounds for k, v in sums.items()})
    out["ms_per_token"] = sums["round_ms"] / tokens if tokens else None
    return out


def text_agreement(samples: list[dict], mode: str, reference: str) -> dict:
    """Per prompt, the first repeat's text of ``mode`` against ``reference``'s: identical texts, and the
    mean share of the reference's characters in the common prefix."""
    def first(m):
        out = {}
        for s in sorted((s for s in samples if s.get("mode") == m and "error" not in s), key=lambda s: s["repeat"]):
            out.setdefault(s["question_id"], s.get("text") or "")
        return out

    a, ref = first(mode), first(reference)
    qs = sorted(set(a) & set(ref))
    shares, identical = [], 0
    for q in qs:
        x, y = a[q], ref[q]
        n = next((i for i, (c, d) in enumerate(zip(x, y)) if c != d), min(len(x), len(y)))
        identical += x == y
        shares.append(n / len(y) if y else 1.0)
    return {"prompts": len(qs), "identical": identical,
            "common_prefix_share": sum(shares) / len(shares) if shares else None}


def failure_lines(analysis: dict, notes: list[str] | None) -> list[str]:
    """A sitting report's closing bullets: failed requests (the first ten), then the run's notes."""
    out = []
    errors = analysis.get("errors") or []
    if errors:
        out.append(f"- **{len(errors)} requests failed**: "
                   + "; ".join(f"{e['mode']} q{e['question_id']}: {e['error']}" for e in errors[:10]))
    out += [f"- {n}" for n in notes or []]
    return out
