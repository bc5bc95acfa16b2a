"""`tandem bench` end to end on tiny models: live in-process services, a tiny Spec-Bench-style JSONL,
every mode (baseline, auto, a k sweep, adaptive, HF plain and assisted; the llama.cpp peers skipped, or
run on the real GGUF when llama_cpp is installed), and checks that the outputs exist and the figures
agree with each other."""

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
    assert [m.name for m in M.priority(modes, 4)] == ["baseline", "k=4", "k=8", "k=1", "k=2", "hf_plain",
                                                      "hf_assisted"]
    assert M.essential(M.priority(modes, 4)) == 2


def test_auto_comes_first_after_plain_and_the_first_fixed_k_always_runs():
    from tandem.bench.plan import plan_modes

    modes = [M.BASELINE_MODE, M.AUTO_MODE] + [M.spec_mode(k) for k in (1, 2, 4)] + \
        [M.adaptive_mode(4, 0.5), M.HF_PLAIN_MODE, M.HF_ASSISTED_MODE, M.LLAMA_PLAIN_MODE, M.LLAMA_LOOKUP_MODE]
    prio = M.priority(modes, 2)
    assert [m.name for m in prio] == ["baseline", "auto", "k=2", "llama_plain", "llama_lookup", "k=4", "k=1",
                                      "hf_plain", "hf_assisted", "adaptive"]
    assert M.essential(prio) == 3 and M.is_fixed_k(M.spec_mode(2)) and not M.is_fixed_k(M.AUTO_MODE)
    assert not M.is_fixed_k(M.adaptive_mode(4, 0.5)) and M.fixed_k_of("k=12") == 12 and M.fixed_k_of("auto") is None
    warm = {m.name: 1.0 for m in modes}
    kept, skipped, _ = plan_modes(prio, warm, 10, available_s=1.0, essential=M.essential(prio))
    assert [m.name for m in kept] == ["baseline", "auto", "k=2"]        # auto's comparison always runs
    kept, skipped, _ = plan_modes(prio, warm, 10, available_s=50.0, essential=M.essential(prio))
    assert [m.name for m in kept] == ["baseline", "auto", "k=2", "llama_plain", "llama_lookup"]
    kept, skipped, _ = plan_modes(prio, warm, 10, available_s=45.0, essential=M.essential(prio))
    assert [m.name for m in kept] == ["baseline", "auto", "k=2", "k=4"]      # the pair (20 s) goes together or not


def test_auto_figures_from_round_stats():
    """Share of rounds per chosen k (k=0: plain steps), probe share, auto vs the best fixed k and plain."""
    from tandem.bench.analysis import analyze
    from tandem.bench.report_auto import auto_sections

    def sample(mode, q, cat, tps, ks=None, reasons=None):
        s = {"mode": mode, "question_id": q, "category": cat, "repeat": 0, "token_ids": [1, 2, 3], "text": "x",
             "tokens_per_s": tps, "ttft_ms": 1.0, "wall_ms": 100.0, "new_tokens": 3}
        if ks is not None:
            s["rounds"] = {"k": ks, "proposed": ks, "accepted": [0] * len(ks), "k_reason": reasons,
                           "emitted": [1] * len(ks)}
        return s

    samples = [sample("baseline", 1, "a", 10.0), sample("baseline", 2, "b", 10.0),
               sample("k=2", 1, "a", 12.0), sample("k=2", 2, "b", 9.0),
               sample("k=4", 1, "a", 15.0), sample("k=4", 2, "b", 8.0),
               sample("auto", 1, "a", 14.0, [4, 4, 2, 4], ["no-figures", "best", "best", "best"]),
               sample("auto", 2, "b", 10.0, [2, 0, 0, 1], ["best", "best", "best", "probe"])]
    prompts = [{"question_id": 1, "category": "a"}, {"question_id": 2, "category": "b"}]
    a = analyze(samples, ["baseline", "auto", "k=2", "k=4"], prompts, greedy=True)
    assert a["equivalence"]["ok"]
    auto = a["auto"]
    assert auto["overall_best_fixed"] == "k=4"                              # 11.5 tok/s against 10.5
    ov = auto["per_group"]["overall"]
    assert ov["vs_best_fixed"] == pytest.approx(12.0 / 11.5) and ov["speedup_vs_baseline"] == pytest.approx(1.2)
    b = auto["per_group"]["b"]
    assert b["best_fixed"] == "k=2" and b["vs_best_fixed"] == pytest.approx(10.0 / 9.0)
    assert b["vs_overall_best_fixed"] == pytest.approx(10.0 / 8.0)
    assert b["choices"]["share_by_k"] == {0: 0.5, 1: 0.25, 2: 0.25} and b["choices"]["probe_share"] == 0.25
    ch = ov["choices"]
    assert ch["rounds"] == 8 and ch["share_by_k"] == {0: 0.25, 1: 0.125, 2: 0.25, 4: 0.375}
    assert ch["plain_step_share"] == 0.25 and ch["probe_share"] == 0.125
    assert ch["mean_k_speculative"] == pytest.approx((4 * 3 + 2 * 2 + 1) / 6)
    results = {"analysis": json.loads(json.dumps(a)), "mode_names": ["baseline", "auto", "k=2", "k=4"]}
    text = "\n".join(auto_sections(results, "Test CPU"))                  # from JSON (string keys) too
    assert "## Auto draft length vs fixed k and plain decoding" in text and "## Auto's choice of k" in text
    assert "| b | 1 | 10.00 | 10.00 | 1.00x | k=2 (9.00 tok/s, 0.90x) | 1.11x | 1.25x | 50% | 25% | 1.50 |" in text
    assert "| k=0 | k=1 | k=2 | k=4 |" in text and "reason probe" in text and "CPU: Test CPU" in text


def test_auto_is_detected_as_pinned_by_a_gateway_with_a_fixed_default():
    from tandem.bench.plan import auto_unavailable

    assert auto_unavailable({"rounds": {"k": [4, 4], "k_reason": ["best", "probe"]}}) is None
    assert "--draft-length auto" in auto_unavailable({"rounds": {"k": [4, 4], "k_reason": ["pinned", "pinned"]}})
    assert "predates" in auto_unavailable({"rounds": {"k": [4]}})


def test_llama_peer_is_skipped_with_one_clear_line_without_llama_cpp(monkeypatch):
    import sys
    from types import SimpleNamespace

    from tandem.bench import llama_peer
    from tandem.bench.runner import _llama_plan

    monkeypatch.setitem(sys.modules, "llama_cpp", None)            # import llama_cpp -> ImportError
    ok, why = llama_peer.available()
    assert not ok and why.startswith("llama.cpp peers skipped: llama_cpp is not importable")
    assert "pip install 'tandem-spec[llama]'" in why and "\n" not in why
    args = SimpleNamespace(no_llama=False, target="default")
    assert _llama_plan(args, {}) == (None, why)
    no = _llama_plan(SimpleNamespace(no_llama=True, target="default"), {})
    assert no == (None, "llama.cpp peers not run (--no-llama)")


def test_agreement_and_floor():
    from tandem.bench.analysis import index
    from tandem.bench.environment import floor, read_bandwidth_gbs
    from tandem.bench.llama_peer import agreement, common_prefix

    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0
    mk = lambda mode, q, ids: {"mode": mode, "question_id": q, "category": "a", "repeat": 0, "token_ids": ids,
                               "tokens_per_s": 1.0}
    idx = index([mk("baseline", 1, [1, 2, 3, 4]), mk("baseline", 2, [5, 6]), mk("llama_plain", 1, [1, 2, 9, 9]),
                 mk("llama_plain", 2, [5, 6])])
    g = agreement(idx, "llama_plain", [1, 2])
    assert g["identical"] == 1 and g["identical_share"] == 0.5 and g["mean_common_prefix"] == 2.0
    assert g["common_prefix_share"] == pytest.approx(4 / 6)
    bw = read_bandwidth_gbs(1, mib=32)
    assert bw["gb_per_s"] > 0 and bw["threads"] == 1
    f = floor({"fp32_bytes": 4e9, "tensor_bytes": 1e9}, {"gb_per_s": 10.0})
    assert f["fp32"]["ms_per_token"] == pytest.approx(400.0) and f["gguf"]["tokens_per_s"] == pytest.approx(10.0)


def test_plan_skips_what_does_not_fit_but_keeps_baseline_and_default_k():
    from tandem.bench.plan import plan_modes

    modes = M.priority([M.BASELINE_MODE, M.spec_mode(2), M.spec_mode(4), M.HF_PLAIN_MODE, M.HF_ASSISTED_MODE], 4)
    warm = {"baseline": 1.0, "k=4": 1.0, "k=2": 0.5, "hf_plain": 1.0, "hf_assisted": 1.0}
    kept, skipped, projected = plan_modes(modes, warm, 10, available_s=26.0)
    assert [m.name for m in kept] == ["baseline", "k=4", "k=2"]       # the HF pair (20 s) does not fit, k=2 does
    assert {s["mode"] for s in skipped} == {"hf_plain", "hf_assisted"} and projected == 25.0
    kept, skipped, _ = plan_modes(modes, warm, 10, available_s=1.0)
    assert [m.name for m in kept] == ["baseline", "k=4"]
    kept, skipped, _ = plan_modes(modes, warm, 10, available_s=None)
    assert len(kept) == 5 and not skipped


def test_tiny_bench_end_to_end(tmp_path, questions, tiny_target_dir, tiny_target_export, monkeypatch):
    """The drafter is the tiny target exported to ONNX (acceptance 100 %, so every draft position is
    exercised); its drafter.json names the HF directory, which HF assisted generation then uses. The
    gateway's default draft length is auto (as the bench starts it)."""
    import sys

    from drafter_service.onnx_drafter import OnnxDrafter
    from tandem.bench.cli import run
    from tandem.cli import build_parser
    from verifier_service.target import Target

    monkeypatch.setitem(sys.modules, "llama_cpp", None)            # the llama.cpp peers: skipped, said once
    drafter_dir = tiny_target_export[0]
    stack = Stack(Target.load(str(tiny_target_dir)), OnnxDrafter(drafter_dir, threads=1), draft_length=0)
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

    for name in ("results.json", "report.md", "speedup.png", "acceptance_by_position.png", "time_breakdown.png",
                 "auto_k_share.png"):
        assert (out / name).stat().st_size > 0, name
    res = json.loads((out / "results.json").read_text())
    assert res["mode_names"] == ["baseline", "auto", "k=1", "k=3", "adaptive", "hf_plain", "hf_assisted"]
    assert res["llama"]["skipped"].startswith("llama.cpp peers skipped: llama_cpp is not importable")
    assert res["hf"]["assistant"].rstrip("/").endswith(tiny_target_dir.name)    # found via drafter.json 'source'
    assert res["environment"]["versions"]["torch"] and res["environment"]["git"]
    assert res["workload"]["prompts"] == 5 and res["workload"]["per_category"] == {"alpha": 3, "beta": 2}
    samples = res["samples"]
    assert len(samples) == 5 * 7 * 3 and not any("error" in s for s in samples)
    assert all(s["new_tokens"] == 12 for s in samples)

    a = res["analysis"]
    eq = a["equivalence"]
    assert eq["applicable"] and eq["ok"] and eq["checked"] == 5 * 5 * 3 - 5    # all Tandem samples but the refs
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
    # per repeat: mean tokens/s of the mode over the group's prompts / the baseline's, in that repeat
    per_repeat = [statistics.mean(s["tokens_per_s"] for s in samples
                                  if s["mode"] == "k=3" and s["question_id"] in (5, 6) and s["repeat"] == r)
                  / statistics.mean(s["tokens_per_s"] for s in samples
                                    if s["mode"] == "baseline" and s["question_id"] in (5, 6) and s["repeat"] == r)
                  for r in range(3)]
    assert beta["speedup_per_repeat"] == pytest.approx(per_repeat)
    assert (beta["speedup_min"], beta["speedup_max"]) == pytest.approx((min(per_repeat), max(per_repeat)))
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
    # the drafter's time: paid on the critical path (a wait or a Propose call) or hidden (drafted ahead, 0 ms)
    k1 = [s for s in samples if s["mode"] == "k=1"]
    k1_rounds = [(src, ms) for s in k1 for src, ms in zip(s["rounds"]["source"], s["rounds"]["draft_ms"])]
    assert k1_rounds and all(src in ("", "ahead", "wait", "propose") for src, _ in k1_rounds)   # "": no block
    assert all(ms == 0 for src, ms in k1_rounds if src in ("", "ahead"))
    assert all(ms > 0 for src, ms in k1_rounds if src in ("wait", "propose"))
    assert a["overall"]["k=1"]["draft_ms_per_round"] == pytest.approx(
        sum(ms for _, ms in k1_rounds) / sum(s["server"]["rounds"] for s in k1))
    assert a["overall"]["baseline"]["draft_ms_per_round"] == 0

    # auto: its rounds' k and reasons are recorded, and the figures agree with them
    auto = [s for s in samples if s["mode"] == "auto"]
    assert all(set(s["rounds"]) >= {"k", "k_reason", "expected_tokens", "emitted", "lookup_tokens"} for s in auto)
    assert not any(r == "pinned" for s in auto for r in s["rounds"]["k_reason"])
    ks = [k for s in auto for k in s["rounds"]["k"]]
    ch = a["auto"]["per_group"]["overall"]["choices"]
    assert ch["rounds"] == len(ks) and max(ks) <= 8
    assert {int(k): v for k, v in ch["share_by_k"].items()} == pytest.approx(
        {k: ks.count(k) / len(ks) for k in set(ks)})
    assert sum(ch["share_by_k"].values()) == pytest.approx(1.0)
    best = max(("k=1", "k=3"), key=lambda m: mean_median_tps(m, all_q))
    ov = a["auto"]["per_group"]["overall"]
    assert ov["best_fixed"] == best and ov["vs_best_fixed"] == pytest.approx(
        mean_median_tps("auto", all_q) / mean_median_tps(best, all_q))
    assert ov["speedup_vs_baseline"] == pytest.approx(mean_median_tps("auto", all_q)
                                                      / mean_median_tps("baseline", all_q))
    assert set(a["auto"]["per_group"]) == {"alpha", "beta", "overall"}

    report = (out / "report.md").read_text()
    assert "## Auto draft length vs fixed k and plain decoding" in report and "auto / best fixed k" in report
    assert "## Auto's choice of k: share of rounds" in report
    choice_section = report.split("## Auto's choice of k: share of rounds", 1)[1].split("\n## ", 1)[0]
    header = next(line for line in choice_section.splitlines() if line.startswith("| category | rounds |"))
    assert all(f"| k={k} |" in header for k in set(ks))           # a column for every k auto chose
    assert "## Tandem beside its peers" in report and "llama_cpp is not importable" in report
    assert f"CPU: **{res['environment']['cpu']}**" in report and "**Floor**" in report
    assert res["floor"]["weights"]["parameters"] > 0 and res["floor"]["bandwidth_before"]["gb_per_s"] > 0
    assert "tokens/s at most" in report
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


def _llama_cpp_importable() -> bool:
    from tandem.bench.llama_peer import available

    return available()[0]


@pytest.mark.integration
@pytest.mark.skipif(not _llama_cpp_importable(), reason="llama_cpp not installed (pip install 'tandem-spec[llama]')")
def test_llama_peer_on_the_default_gguf():
    """The real default GGUF (there is no tiny one), one prompt, 8 tokens, plain and prompt lookup."""
    from tandem.bench.llama_peer import LlamaCppRunner, chat_prompt_ids, gguf_path
    from tandem.bench.settings import Settings
    from tandem.bench.workload import Prompt
    from tandem.models import load_tokenizer

    gguf, why = gguf_path("default")
    if gguf is None:
        pytest.skip(why)
    tok = load_tokenizer("default")
    prompt = Prompt(question_id=1, category="alpha", text="Repeat after me: one two three four five six seven.")
    runner = LlamaCppRunner(gguf, tok, [tok.eos_token_id], threads=1, n_ctx=256, lookup_tokens=4)
    assert runner.prompt_ids(prompt) == chat_prompt_ids(tok, prompt.text)         # the gateway's ids
    settings = Settings(max_tokens=8)
    out = {m.name: runner.run(m, prompt, settings) for m in (M.LLAMA_PLAIN_MODE, M.LLAMA_LOOKUP_MODE)}
    for s in out.values():
        assert "error" not in s, s
        assert 0 < s["new_tokens"] <= 8 and s["tokens_per_s"] > 0
        assert s["prompt_tokens"] == len(runner.prompt_ids(prompt))
    again = runner.run(M.LLAMA_PLAIN_MODE, prompt, settings, repeat=1)           # fresh KV cache: same output
    assert again["token_ids"] == out["llama_plain"]["token_ids"]
    cfg = runner.config()
    assert cfg["threads"] == 1 and cfg["gguf"].endswith(".gguf") and cfg["llama_cpp_python"]


def _fake_llama_cpp(monkeypatch, output: list[int]):
    """A stand-in ``llama_cpp`` (the real one needs a GGUF; there is no tiny one): ``generate`` yields
    ``output`` whatever the prompt, so the plumbing (loading, warm-up, plan, agreement, report) is tested."""
    import sys
    import types

    class Llama:
        def __init__(self, model_path, n_threads, n_threads_batch, n_ctx, verbose, draft_model=None, logits_all=False):
            # the real one sizes its score buffer from the logits_all argument: a draft model needs it True
            assert draft_model is None or logits_all, "a draft model needs logits_all=True (llama-cpp-python 0.3.x)"
            self.kw = dict(model_path=model_path, n_threads=n_threads, n_ctx=n_ctx, draft_model=draft_model,
                           logits_all=logits_all)
            self.resets = 0

        def token_eos(self):
            return 0

        def reset(self):
            self.resets += 1

        def set_seed(self, seed):
            pass

        def generate(self, tokens, reset=True, **sampling):
            assert sampling["temp"] == 0.0 and sampling["repeat_penalty"] == 1.0 and tokens
            yield from output

    class LlamaPromptLookupDecoding:
        def __init__(self, max_ngram_size=2, num_pred_tokens=10):
            self.max_ngram_size, self.num_pred_tokens = max_ngram_size, num_pred_tokens

    mod = types.ModuleType("llama_cpp")
    mod.Llama, mod.__version__ = Llama, "0.0-fake"
    spec = types.ModuleType("llama_cpp.llama_speculative")
    spec.LlamaPromptLookupDecoding = LlamaPromptLookupDecoding
    mod.llama_speculative = spec
    monkeypatch.setitem(sys.modules, "llama_cpp", mod)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_speculative", spec)


def test_llama_peers_in_a_run_with_a_stand_in_llama_cpp(tmp_path, questions, tiny_target_dir, tiny_target_export,
                                                        monkeypatch):
    from drafter_service.onnx_drafter import OnnxDrafter
    from tandem.bench import llama_peer
    from tandem.bench.cli import run
    from tandem.cli import build_parser
    from verifier_service.target import Target

    fake_gguf = tmp_path / "tiny.gguf"
    fake_gguf.write_bytes(b"GGUF" + b"\0" * 60)
    monkeypatch.setattr(llama_peer, "gguf_path", lambda spec: (fake_gguf, ""))
    _fake_llama_cpp(monkeypatch, [7, 8, 9, 10, 11, 12, 13, 14])
    stack = Stack(Target.load(str(tiny_target_dir)), OnnxDrafter(tiny_target_export[0], threads=1), draft_length=0)
    out = tmp_path / "bench"
    try:
        args = build_parser(only="bench").parse_args([
            "bench", "--gateway", stack.gateway_addr, "--verifier-addr", stack.verifier_addr,
            "--drafter-addr", stack.drafter_addr, "--target", str(tiny_target_dir), "--drafter",
            str(tiny_target_export[0]), "--questions", str(questions), "--k-sweep", "2", "--default-k", "2",
            "--adaptive-k", "0", "--no-hf", "--max-tokens", "6", "--repeats", "1", "--time-budget", "0",
            "--out", str(out), "--no-progress", "--ignore-eos", "--limit-per-category", "1"])
        assert run(args) == 0
    finally:
        stack.close()
    res = json.loads((out / "results.json").read_text())
    assert res["mode_names"] == ["baseline", "auto", "k=2", "llama_plain", "llama_lookup"]
    assert res["llama"]["threads"] == 1 and res["llama"]["llama_cpp_python"] == "0.0-fake"
    llama = [s for s in res["samples"] if s["mode"].startswith("llama")]
    assert len(llama) == 2 * 2 and all(s["token_ids"] == [7, 8, 9, 10, 11, 12] for s in llama)   # max_tokens cut
    a = res["analysis"]
    assert a["equivalence"]["ok"]                                    # llama.cpp is outside the equivalence check
    g = a["llama"]["llama_plain"]["overall"]
    assert g["prompts"] == 2 and g["reference"] == "baseline"
    assert a["llama"]["lookup_vs_plain"]["overall"]["identical"] == 2
    assert a["overall"]["llama_lookup"]["speedup_vs_llama_plain"] > 0
    report = (out / "report.md").read_text()
    assert "| llama.cpp plain |" in report and "| llama.cpp lookup |" in report
    assert "llama.cpp prompt lookup vs llama.cpp plain" in report and "identical;" in report
    cpu = res["environment"]["cpu"]
    assert f"| {cpu} |" in report.split("## Tandem beside its peers")[1].split("##")[0]
