"""Spec-Bench prompts for the integration tests (from the shared data folder beside the repository)."""

import json
from pathlib import Path

import pytest

SPEC_BENCH = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "spec_bench" / "question.jsonl"


def spec_bench_prompts(categories, per_category=1):
    """First-turn prompts of the benchmark split (question_id % 4 != 0), in file order."""
    if not SPEC_BENCH.exists():
        pytest.skip(f"Spec-Bench questions not found at {SPEC_BENCH}")
    picked = {c: [] for c in categories}
    for line in SPEC_BENCH.read_text().splitlines():
        q = json.loads(line)
        if q["question_id"] % 4 and q["category"] in picked and len(picked[q["category"]]) < per_category:
            picked[q["category"]].append((q["question_id"], q["category"], q["turns"][0]))
    return [p for c in categories for p in picked[c]]
