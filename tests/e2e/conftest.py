"""Integration fixtures: the real default pair, loaded once per test session."""

import json
from pathlib import Path

import pytest

SPEC_BENCH = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "spec_bench" / "question.jsonl"


@pytest.fixture(scope="session")
def default_target():
    from verifier_service.target import Target

    return Target.load("default")


@pytest.fixture(scope="session")
def default_drafter():
    from drafter_service.onnx_drafter import OnnxDrafter
    from tandem.defaults import resolve_drafter

    return OnnxDrafter(resolve_drafter("default"), threads=1)


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
