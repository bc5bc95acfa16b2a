"""The benchmark's outputs: ``results.json`` (every raw figure) and ``report.md`` (the readable part)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from tandem.bench import modes as M
from tandem.bench.memory import fmt_bytes


def write_json(results: dict, path: Path) -> None:
    path.write_text(json.dumps(results, indent=1, default=str) + "\n")


def _f(x, fmt="{:.2f}", none="n/a") -> str:
    return none if x is None else fmt.format(x)


def _speedup(fig: dict, key: str = "speedup", spread: bool = True) -> str:
    v = fig.get(key)
    if v is None:
        return "–"
    s = f"{v:.2f}x"
    if spread and fig.get("speedup_min") is not None and key == "speedup":
        s += f" [{fig['speedup_min']:.2f}–{fig['speedup_max']:.2f}]"
    return f"**{s}** ↓" if v < 1.0 else s


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _mode_label(m: str) -> str:
    return {M.BASELINE: "baseline", M.HF_PLAIN: "HF plain", M.HF_ASSISTED: "HF assisted"}.get(m, m)


def markdown(results: dict) -> str:
    a = results["analysis"]
    cfg = results["config"]
    env = results["environment"]
    models = results.get("models") or {}
    modes = results["mode_names"]
    eq = a["equivalence"]
    L: list[str] = []
    target = models.get("target") or {}
    drafter = models.get("drafter") or {}
    files = models.get("drafter_files") or {}
    L.append(f"# Tandem benchmark: {target.get('model_name', '?')} with drafter {drafter.get('model_name', '?')}")
    L.append("")
    L.append(f"Run {results['started_at']} – {results['finished_at']} ({results['wall_s'] / 60:.1f} min in all, "
             f"timed phase {results.get('timed_s', 0) / 60:.1f} min).")
    L.append("")
    L.append("```\n" + " ".join(shlex.quote(x) for x in results["command"]) + "\n```")
    L.append("")
    for m in results.get("modes") or []:
        if m.get("adaptive"):
            L.append(f"Mode `adaptive`: adaptive k<={m['k']} (stop below p {m['confidence']:g}): up to {m['k']} draft "
                     f"tokens a round, the drafter ending a block before a token whose drafter probability is below "
                     f"{m['confidence']:g}. Fixed-k modes draft exactly k tokens a round.")
            L.append("")

    # ---- verdict first: equivalence ----------------------------------------------------------
    L.append("## Greedy output equivalence")
    L.append("")
    if not eq.get("applicable"):
        L.append(f"Not applicable: {eq['note']}")
    elif eq["ok"]:
        L.append(f"**OK**: all {eq['checked']} outputs of the Tandem modes (every speculative mode, every repeat, "
                 "the baseline's own repeats) are token-identical to the baseline's output for the same prompt.")
    else:
        L.append(f"**MISMATCH — {len(eq['mismatches'])} of {eq['checked']} Tandem outputs differ from the baseline.** "
                 "Speculative decoding must be lossless; every mismatch is listed:")
        L.append("")
        L += _table(["mode", "question", "category", "repeat", "first diff at", "tokens (ref)", "output", "baseline"],
                    [[x["mode"], str(x["question_id"]), x["category"], str(x["repeat"]),
                      str(x["first_difference_at"]), f"{x['tokens']} ({x['reference_tokens']})",
                      _cell(x["text"]), _cell(x["reference_text"])] for x in eq["mismatches"]])
    if eq.get("hf"):
        h = eq["hf"]
        if h["ok"]:
            L.append("")
            L.append(f"HF: assisted generation matches HF plain generation, and HF plain matches the Tandem baseline "
                     f"({h['checked']} outputs compared).")
        else:
            L.append("")
            L.append(f"**HF MISMATCH — {len(h['mismatches'])} of {h['checked']} HF outputs differ** "
                     f"(assisted vs plain: {h['assisted_vs_plain']['mismatches']}; HF plain vs Tandem baseline: "
                     f"{h['plain_vs_tandem_baseline']['mismatches']}):")
            L.append("")
            L += _table(["mode", "against", "question", "repeat", "first diff at", "output", "reference"],
                        [[x["mode"], x["against"], str(x["question_id"]), str(x["repeat"]),
                          str(x["first_difference_at"]), _cell(x["text"]), _cell(x["reference_text"])]
                         for x in h["mismatches"]])
    L.append("")

    # ---- summary -----------------------------------------------------------------------------
    L.append("## Summary (all prompts)")
    L.append("")
    o = a["overall"]
    rows = []
    for m in modes:
        f = o.get(m, {})
        sp = _speedup(f) if m != M.BASELINE else "1.00x"
        if m == M.HF_ASSISTED and f.get("speedup_vs_hf_plain") is not None:
            sp += f"; {f['speedup_vs_hf_plain']:.2f}x vs HF plain"
        rows.append([_mode_label(m), _f(f.get("tokens_per_s")), sp, _f(f.get("mean_acceptance_length")),
                     _f(f.get("acceptance_rate")), _f(f.get("ttft_ms"), "{:.0f}"), _f(f.get("rounds"), "{:.1f}"),
                     _f(f.get("draft_ms_per_round"), "{:.1f}"), _f(f.get("verify_ms_per_round"), "{:.1f}"),
                     _f(f.get("overhead_ms_per_round"), "{:.1f}"), _f(f.get("new_tokens"), "{:.1f}")])
    L += _table(["mode", "tokens/s", "speedup [per-repeat min–max]", "mean acc. length τ", "acc. rate",
                 "TTFT ms", "rounds/req", "draft ms/round", "verify ms/round", "overhead ms/round", "new tokens"],
                rows)
    L.append("")
    L.append("tokens/s: mean over prompts of each prompt's median over repeats (client wall time, prefill "
             "included). Speedup: that mean over the baseline's (Spec-Bench). τ: tokens per target forward after "
             "the prefill (HF: new tokens / target forwards). ↓ marks a speedup below 1: speculation loses there.")
    if a.get("best_mode"):
        b = a["best_mode"]
        L.append("")
        L.append(f"Best Tandem mode overall: **{b}**, {o[b]['speedup']:.2f}x.")
    L.append("")

    # ---- per category -----------------------------------------------------------------------
    L.append("## Speedup per category")
    L.append("")
    spec_modes = [m for m in modes if m not in (M.BASELINE, M.HF_PLAIN)]
    rows = []
    for c in a["categories"] + ["overall"]:
        figs = a["per_category"][c] if c != "overall" else o
        base = figs.get(M.BASELINE, {})
        row = [f"**{c}**" if c == "overall" else c, str(base.get("prompts", 0)), _f(base.get("tokens_per_s"))]
        for m in spec_modes:
            f = figs.get(m, {})
            row.append(_speedup(f, "speedup_vs_hf_plain" if m == M.HF_ASSISTED else "speedup", spread=False))
        rows.append(row)
    L += _table(["category", "prompts", "baseline tok/s"] + [
        "HF assisted vs HF plain" if m == M.HF_ASSISTED else m for m in spec_modes], rows)
    L.append("")
    L.append("## Mean acceptance length τ per category")
    L.append("")
    acc_modes = [m for m in modes if m != M.BASELINE and m != M.HF_PLAIN]
    rows = []
    for c in a["categories"] + ["overall"]:
        figs = a["per_category"][c] if c != "overall" else o
        rows.append([c] + [_f(figs.get(m, {}).get("mean_acceptance_length")) + (
            f" ({_f(figs[m].get('acceptance_rate'))})" if figs.get(m, {}).get("acceptance_rate") is not None else "")
                           for m in acc_modes])
    L += _table(["category"] + [f"{m} τ (rate)" for m in acc_modes], rows)
    L.append("")

    L.append("## Per category and mode")
    L.append("")
    rows = []
    for c in a["categories"]:
        for m in modes:
            f = a["per_category"][c].get(m, {})
            if not f.get("prompts"):
                continue
            pos = f.get("acceptance_by_position")
            rows.append([c, _mode_label(m), _f(f.get("tokens_per_s")), _f(f.get("ttft_ms"), "{:.0f}"),
                         _f(f.get("mean_acceptance_length")), _f(f.get("acceptance_rate")),
                         " ".join(_f(x) for x in pos) if pos else "–", _f(f.get("draft_ms_per_round"), "{:.1f}"),
                         _f(f.get("verify_ms_per_round"), "{:.1f}"), _f(f.get("overhead_ms_per_round"), "{:.1f}"),
                         _f(f.get("rounds"), "{:.1f}"), _f(f.get("prompt_tokens"), "{:.0f}")])
    L += _table(["category", "mode", "tokens/s", "TTFT ms", "τ", "acc. rate", "acceptance by position",
                 "draft ms/round", "verify ms/round", "overhead ms/round", "rounds/req", "prompt tokens"], rows)
    L.append("")

    # ---- acceptance by position ---------------------------------------------------------------
    width = max((len(o.get(m, {}).get("acceptance_by_position") or []) for m in modes), default=0)
    if width:
        L.append("## Acceptance by draft position (all prompts)")
        L.append("")
        rows = []
        for m in modes:
            rates = o.get(m, {}).get("acceptance_by_position")
            if rates:
                rows.append([m] + [_f(r) for r in rates] + ["" for _ in range(width - len(rates))])
        L += _table(["mode"] + [str(i + 1) for i in range(width)], rows)
        L.append("")

    # ---- memory -------------------------------------------------------------------------------
    L.append("## Peak memory")
    L.append("")
    rows = []
    for name, m in (results.get("memory") or {}).items():
        peak = m.get("peak_rss_bytes", m.get("rss_bytes"))
        rows.append([name, fmt_bytes(peak), fmt_bytes(m.get("max_rss_during_run_bytes")),
                     m.get("source", "") + (f" ({m['note']})" if m.get("note") else "")])
    L += _table(["process", "peak RSS (incl. model load)", "max RSS sampled in the timed phase", "source"], rows)
    L.append("")

    # ---- setting ------------------------------------------------------------------------------
    L.append("## Setting")
    L.append("")
    plan = results["plan"]
    w = results["workload"]
    L.append(f"- Machine: {env['cpu']} ({', '.join(env.get('cpu_flags') or [])}), {env['usable_cores']} usable "
             f"cores of {env['logical_cores']}, {fmt_bytes(env.get('memory_bytes'))} RAM; load average "
             f"{env.get('load_average_start')} at start, {results.get('load_average_before_timed')} before and "
             f"{results.get('load_average_after_timed')} after the timed phase (other work on the machine slows "
             "every mode alike: modes are interleaved per prompt).")
    v = env["versions"]
    L.append("- Software: " + ", ".join(f"{k} {v[k]}" for k in v) +
             f"; commit {env['git'].get('commit')}{' (dirty tree)' if env['git'].get('dirty') else ''}.")
    L.append(f"- Target: {target.get('model_name', '?')} (vocab {target.get('vocab_size', '?')}, spec "
             f"`{models.get('target_spec')}`), verifier at {results['services'].get('verifier')}.")
    L.append(f"- Drafter: {drafter.get('model_name', '?')} served from `{files.get('path', '?')}` "
             f"(ONNX; quantize {files.get('quantize')}, draft vocab {files.get('draft_vocab')}, source "
             f"`{files.get('source')}`).")
    if results.get("hf"):
        h = results["hf"]
        L.append(f"- HF peer baseline: `model.generate` of target `{h['target']}`, alone (HF plain) and with "
                 f"`assistant_model=` `{h['assistant']}` (HF assisted), in the bench process with "
                 f"{h.get('torch_threads')} torch threads; {h['setting']}"
                 + (f"; the assistant's logits are masked to the {h['assistant_draft_vocab']}-token draft vocabulary, "
                    "as in the ONNX drafter" if h.get("assistant_draft_vocab") else "") + ".")
    sv = results["services"]
    pinned = (f"; verifier and gateway pinned to CPUs {sv['verifier_cpus'] or 'all'}, drafter to CPUs "
              f"{sv['drafter_cpus'] or 'all'}" if sv.get("verifier_cpus") or sv.get("drafter_cpus") else "")
    L.append(f"- Services: {sv['mode']}"
             + (f" by the bench (startup {sv['startup_s']:.0f} s, verifier threads {sv['verifier_threads']} "
                f"(0 = torch default), drafter threads {sv['drafter_threads']}{pinned})"
                if sv["mode"] == "started" else ""))
    L.append(f"- Workload: {w['questions']} split `{w['split']}` ({w['split_rule']}), first turn, chat template; "
             f"{w['prompts']} prompts in {len(w['categories'])} categories "
             f"({', '.join(f'{c} {n}' for c, n in w['per_category'].items())}).")
    L.append(f"- Decoding: {'greedy' if cfg['temperature'] == 0 else 'sampled, T=' + str(cfg['temperature'])}, "
             f"top-k {cfg['top_k']}, top-p {cfg['top_p']}, at most {cfg['max_tokens']} new tokens, "
             f"{'EOS ignored' if cfg['ignore_eos'] else 'stop at EOS'}; {cfg['repeats']} repeats"
             + (" (**fewer than 3: the spread means little**)" if cfg["repeats"] < 3 else "") + ".")
    L.append(f"- Warm-up: one priming request, then one untimed request per mode on question "
             f"{plan['warmup_prompt']} (times: " + ", ".join(f"{k} {v:.1f} s" for k, v in plan["warmup_s"].items())
             + ").")
    L.append(f"- Plan: {plan['requests']} timed requests, projected {plan['projected_timed_s'] / 60:.1f} min, "
             f"took {results.get('timed_s', 0) / 60:.1f} min; time budget "
             f"{(str(round(plan['budget_s'] / 60, 1)) + ' min') if plan['budget_s'] else 'none'}.")
    for sk in plan["skipped"]:
        L.append(f"- **Skipped {sk['mode']}**: {sk['reason']}.")
    for n in results.get("notes", []):
        L.append(f"- {n}")
    if a["errors"]:
        L.append(f"- **{len(a['errors'])} requests failed** (left out of every figure): "
                 + "; ".join(f"{e['mode']} q{e['question_id']} r{e['repeat']}: {e['error']}" for e in a["errors"][:10]))
    if a["fallbacks"]:
        L.append(f"- **{len(a['fallbacks'])} speculative requests ran without the drafter** (gateway fallback): "
                 + "; ".join(f"{f['mode']} q{f['question_id']}: {f['reason']}" for f in a["fallbacks"][:10]))
    L.append("")

    # ---- plots ------------------------------------------------------------------------------
    L.append("## Plots")
    L.append("")
    for key, title in (("speedup", "Speedup per category"), ("acceptance", "Acceptance by position"),
                       ("time", "Time per round")):
        if key in results.get("plots", {}):
            L.append(f"![{title}]({Path(results['plots'][key]).name})")
            L.append("")

    # ---- per prompt ---------------------------------------------------------------------------
    L.append("## Per prompt")
    L.append("")
    rows = []
    for r in a["per_prompt"]:
        rows.append([str(r["question_id"]), r["category"], r["mode"],
                     f"{r['tokens_per_s']:.2f} [{r['tokens_per_s_min']:.2f}–{r['tokens_per_s_max']:.2f}]",
                     _f(r.get("speedup"), "{:.2f}x"), _f(r.get("ttft_ms"), "{:.0f}"), str(r.get("prompt_tokens")),
                     str(r["new_tokens"]), _f(r.get("mean_acceptance_length")), _f(r.get("acceptance_rate"))])
    L += _table(["question", "category", "mode", "tokens/s median [min–max]", "speedup", "TTFT ms", "prompt tokens",
                 "new tokens", "τ", "acc. rate"], rows)
    L.append("")
    return "\n".join(L)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:120]


def write_markdown(results: dict, path: Path) -> None:
    path.write_text(markdown(results))


def console_summary(results: dict) -> str:
    a = results["analysis"]
    o = a["overall"]
    lines = [f"{'mode':<12} {'tok/s':>7} {'speedup':>8} {'tau':>5} {'acc':>5} {'TTFT ms':>8}"]
    for m in results["mode_names"]:
        f = o.get(m, {})
        lines.append(f"{m:<12} {_f(f.get('tokens_per_s')):>7} {_f(f.get('speedup'), '{:.2f}x'):>8} "
                     f"{_f(f.get('mean_acceptance_length')):>5} {_f(f.get('acceptance_rate')):>5} "
                     f"{_f(f.get('ttft_ms'), '{:.0f}'):>8}"
                     + (f"  ({f['speedup_vs_hf_plain']:.2f}x vs hf_plain)" if f.get("speedup_vs_hf_plain") else ""))
    eq = a["equivalence"]
    if eq.get("applicable"):
        lines.append(f"greedy equivalence: {'OK' if eq['ok'] else 'MISMATCH'} ({len(eq['mismatches'])} of "
                     f"{eq['checked']} differ)" + (f"; HF: {'OK' if eq['hf']['ok'] else 'MISMATCH'} "
                                                   f"({len(eq['hf']['mismatches'])} of {eq['hf']['checked']})"
                                                   if eq.get("hf") else ""))
    return "\n".join(lines)
