"""`tandem bench` end to end on tiny models: live in-process services, a tiny Spec-Bench-style JSONL,
every mode (baseline, a k sweep, HF plain and assisted), and checks that the outputs exist and the
figures agree with each other."""

from __future__ import annotations

import json

import pytest
from harness import Stack

from tandem.bench import modes as M
from tandem.bench.workload import interleave_by_category, load_questions

QUESTIONS = [
    # question_id % 4 == 0 is the drafter's training split: excluded by default
    {"question_id": 1, "category": "alpha", "turns": ["w1 w5 w9 w20", "second turn is ignored"]},
    {"question_id": 2, "category": "alpha", "turns": ["w3 w4 w7"]},
    {"question_id": 3, "category": "alpha", "turns": ["w11 w12"]},
    {"question_id": 4, "category": "alpha", "turns": ["w40 w41 (training split)"]},
    {"question_id": 5, "category": "beta", "turns": ["w30 w31 w32 w33 w34"]},
    {"question_id": 6, "category": "beta", "turns": ["w50 w2 w8"]},
    {"question_id": 8, "category": "beta", "turns": ["w6 (training split)"]},
]


@pytest.fixture()
def questions(tmp_path):
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


def test_workload_split_limit_and_order(questions):
    prompts = load_questions(questions)
    assert [p.question_id for p in prompts] == [1, 2, 3, 5, 6]
    assert prompts[0].text == "w1 w5 w9 w20"                         # first turn only
    assert [p.question_id for p in load_questions(questions, split="train")] == [4, 8]
    limited = load_questions(questions, limit_per_category=1, categories=["beta", "alpha"])
    assert [p.question_id for p in limited] == [5, 1]
    assert [p.question_id for p in interleave_by_category(prompts)] == [1, 5, 2, 6, 3]
    with pytest.raises(ValueError, match="unknown categories"):
        load_questions(questions, categories=["gamma"])


def test_mode_priority_keeps_the_sweep_spread():
    assert M.coverage_order([1, 2, 3, 4, 6, 8], 4) == [4, 8, 1, 6, 2, 3]
    modes = [M.BASELINE_MODE] + [M.spec_mode(k) for k in (1, 2, 4, 8)] + [M.HF_PLAIN_MODE, M.HF_ASSISTED_MODE]
    assert [m.name for m in M.priority(modes, 4)] == ["baseline", "k=4", "hf_plain", "hf_assisted", "k=8", "k=1",
                                                      "k=2"]


def test_plan_skips_what_does_not_fit_but_keeps_baseline_and_default_k():
    from tandem.bench.runner import plan_modes

    modes = M.priority([M.BASELINE_MODE, M.spec_mode(2), M.spec_mode(4), M.HF_PLAIN_MODE, M.HF_ASSISTED_MODE], 4)
    warm = {"baseline": 1.0, "k=4": 1.0, "k=2": 0.5, "hf_plain": 1.0, "hf_assisted": 1.0}
    kept, skipped, projected = plan_modes(modes, warm, 10, available_s=26.0)
    assert [m.name for m in kept] == ["baseline", "k=4", "k=2"]       # the HF pair (20 s) does not fit, k=2 does
    assert {s["mode"] for s in skipped} == {"hf_plain", "hf_assisted"} and projected == 25.0
    kept, skipped, _ = plan_modes(modes, warm, 10, available_s=1.0)
    assert [m.name for m in kept] == ["baseline", "k=4"]
    kept, skipped, _ = plan_modes(modes, warm, 10, available_s=None)
    assert len(kept) == 5 and not skipped


def test_tiny_bench_end_to_end(tmp_path, questions, tiny_target_dir, tiny_target_export):
    """The drafter is the tiny target exported to ONNX (acceptance 100 %, so every draft position is
    exercised); its drafter.json names the HF directory, which HF assisted generation then uses."""
    from drafter_service.onnx_drafter import OnnxDrafter
    from tandem.bench.cli import run
    from tandem.cli import build_parser
    from verifier_service.target import Target

    drafter_dir = tiny_target_export[0]
    stack = Stack(Target.load(str(tiny_target_dir)), OnnxDrafter(drafter_dir, threads=1))
    out = tmp_path / "bench"
    try:
        args = build_parser(only="bench").parse_args([
            "bench", "--gateway", stack.gateway_addr, "--verifier-addr", stack.verifier_addr,
            "--drafter-addr", stack.drafter_addr, "--target", str(tiny_target_dir), "--drafter",
            str(drafter_dir), "--questions", str(questions), "--k-sweep", "1,3", "--default-k", "3",
            "--adaptive-k", "4", "--draft-confidence", "0.5",
            "--max-tokens", "12", "--repeats", "3", "--time-budget", "0", "--out", str(out), "--no-progress",
            "--ignore-eos"])
        assert run(args) == 0
    finally:
        stack.close()

    for name in ("results.json", "report.md", "speedup.png", "acceptance_by_position.png", "time_breakdown.png"):
        assert (out / name).stat().st_size > 0, name
    res = json.loads((out / "results.json").read_text())
    assert res["mode_names"] == ["baseline", "k=1", "k=3", "adaptive", "hf_plain", "hf_assisted"]
    assert res["hf"]["assistant"].rstrip("/").endswith(tiny_target_dir.name)    # found via drafter.json 'source'
    assert res["environment"]["versions"]["torch"] and res["environment"]["git"]
    assert res["workload"]["prompts"] == 5 and res["workload"]["per_category"] == {"alpha": 3, "beta": 2}
    samples = res["samples"]
    assert len(samples) == 5 * 6 * 3 and not any("error" in s for s in samples)
    assert all(s["new_tokens"] == 12 for s in samples)

    a = res["analysis"]
    eq = a["equivalence"]
    assert eq["applicable"] and eq["ok"] and eq["checked"] == 5 * 4 * 3 - 5    # all Tandem samples but the refs
    assert eq["hf"]["ok"], eq["hf"]["mismatches"]

    # speedup = mean tokens/s of the mode / mean tokens/s of the baseline (per-prompt medians over repeats)
    import statistics

    def mean_median_tps(mode, qids):
        return statistics.mean(statistics.median(s["tokens_per_s"] for s in samples
                                                 if s["mode"] == mode and s["question_id"] == q) for q in qids)

    all_q = [1, 2, 3, 5, 6]
    for m in ("k=1", "k=3", "hf_assisted"):
        assert a["overall"][m]["speedup"] == pytest.approx(mean_median_tps(m, all_q) / mean_median_tps("baseline", all_q))
    beta = a["per_category"]["beta"]["k=3"]
    assert beta["speedup"] == pytest.approx(mean_median_tps("k=3", [5, 6]) / mean_median_tps("baseline", [5, 6]))
    assert beta["speedup_min"] <= beta["speedup"] * 1.0001 or beta["speedup_max"] >= beta["speedup"] * 0.9999
    assert len(beta["speedup_per_repeat"]) == 3
    assert a["overall"]["hf_assisted"]["speedup_vs_hf_plain"] == pytest.approx(
        mean_median_tps("hf_assisted", all_q) / mean_median_tps("hf_plain", all_q))

    # acceptance figures agree with the raw round statistics
    k3 = [s for s in samples if s["mode"] == "k=3"]
    rounds = sum(s["server"]["rounds"] for s in k3)
    accepted = sum(s["server"]["accepted"] for s in k3)
    assert a["overall"]["k=3"]["mean_acceptance_length"] == pytest.approx(1 + accepted / rounds)
    assert a["overall"]["k=3"]["acceptance_rate"] == pytest.approx(accepted / sum(s["server"]["proposed"] for s in k3))
    assert len(a["overall"]["k=3"]["acceptance_by_position"]) == 3
    assert all(max(s["rounds"]["proposed"]) <= 3 for s in k3)
    assert all(set(s["rounds"]["proposed"][:-1]) == {3} for s in k3)   # fixed k (the last round may be cut)
    # adaptive: the tiny random drafter is never 50 % sure of a token, so every block stops after one
    adaptive = [s for s in samples if s["mode"] == "adaptive"]
    assert adaptive and all(set(s["rounds"]["proposed"][:-1]) == {1} for s in adaptive)
    assert a["overall"]["baseline"]["mean_acceptance_length"] == 1.0
    assert all(s["server"]["speculative"] for s in k3)
    assert a["overall"]["k=3"]["mean_acceptance_length"] > 1.0            # the drafter is the target itself
    assert a["overall"]["k=1"]["draft_ms_per_round"] > 0 and a["overall"]["baseline"]["draft_ms_per_round"] == 0

    report = (out / "report.md").read_text()
    assert "## Greedy output equivalence" in report and "**OK**" in report
    assert "adaptive k<=4 (stop below p 0.5)" in report
    assert "| beta |" in report and "speedup.png" in report
    assert "## Per category and mode" in report
    # peak RSS of live services is "n/a" unless pids or a metrics endpoint are given
    assert res["memory"]["verifier"]["source"] == "n/a"

    # the report and plots can be rewritten from the JSON alone
    from tandem.bench.cli import rerender

    (out / "report.md").unlink()
    assert rerender(out / "results.json") == 0 and (out / "report.md").read_text() == report


def test_mismatch_is_reported_not_averaged(tmp_path):
    from tandem.bench.analysis import analyze

    def sample(mode, repeat, ids):
        return {"mode": mode, "question_id": 1, "category": "alpha", "repeat": repeat, "token_ids": ids,
                "text": " ".join(map(str, ids)), "tokens_per_s": 10.0, "ttft_ms": 1.0, "wall_ms": 100.0,
                "new_tokens": len(ids)}

    samples = [sample("baseline", 0, [5, 6, 7]), sample("k=2", 0, [5, 6, 7]), sample("k=2", 1, [5, 9, 7])]
    a = analyze(samples, ["baseline", "k=2"], [{"question_id": 1, "category": "alpha"}], greedy=True)
    eq = a["equivalence"]
    assert not eq["ok"] and eq["checked"] == 2
    assert eq["mismatches"][0]["repeat"] == 1 and eq["mismatches"][0]["first_difference_at"] == 1
