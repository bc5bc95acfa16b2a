"""The benchmark's outputs: ``results.json`` (every raw figure), ``report.md`` (the readable part) and
the console summary.

``report.md`` opens with the run, its command and the machine, then the verdict (greedy output
equivalence), then the figures (``report_figures``, ``report_auto``, ``report_peers``), the memory,
the setting of the run, the plots and the per-prompt table.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from tandem.bench import modes as M
from tandem.bench.memory import fmt_bytes
from tandem.bench.report_auto import auto_sections
from tandem.bench.report_figures import category_sections, per_prompt_section, position_section, summary_section
from tandem.bench.report_peers import peer_sections
from tandem.bench.tables import fmt, int_keys, pct, table, text_cell


def write_json(results: dict, path: Path) -> None:
    path.write_text(json.dumps(results, indent=1, default=str) + "\n")


def markdown(results: dict) -> str:
    """``report.md`` of a run's results (the dict ``results.json`` holds)."""
    a, modes = results["analysis"], results["mode_names"]
    cpu = results["environment"].get("cpu", "?")
    L = _header(results)
    L += _equivalence(a["equivalence"])
    L += summary_section(a, modes)
    L += auto_sections(results, cpu)
    L += peer_sections(results, cpu)
    L += category_sections(a, modes)
    L += position_section(a, modes)
    L += _memory(results)
    L += _setting(results)
    L += _plots(results)
    L += per_prompt_section(a)
    return "\n".join(L)


def _header(results: dict) -> list[str]:
    """The title, the run's times and command, the CPU, and what the auto and adaptive modes are."""
    env = results["environment"]
    models = results.get("models") or {}
    target = models.get("target") or {}
    drafter = models.get("drafter") or {}
    L: list[str] = []
    L.append(f"# Tandem benchmark: {target.get('model_name', '?')} with drafter {drafter.get('model_name', '?')}")
    L.append("")
    L.append(f"Run {results['started_at']} – {results['finished_at']} ({results['wall_s'] / 60:.1f} min in all, "
             f"timed phase {results.get('timed_s', 0) / 60:.1f} min).")
    L.append("")
    L.append("```\n" + " ".join(shlex.quote(x) for x in results["command"]) + "\n```")
    L.append("")
    cpu = env.get("cpu", "?")
    L.append(f"CPU: **{cpu}** ({env.get('usable_cores')} usable cores of {env.get('logical_cores')}): every figure "
             "of this report was measured on it.")
    L.append("")
    for m in results.get("modes") or []:
        if m.get("auto"):
            L.append("Mode `auto`: the gateway's automatic draft length (GenerateRequest.draft_length 0): every "
                     "round's k (0 = a plain step) maximises expected tokens per ms from measured costs; `k=N` "
                     "modes pin k = N per request.")
            L.append("")
        if m.get("adaptive"):
            L.append(f"Mode `adaptive`: adaptive k<={m['k']} (stop below p {m['confidence']:g}): up to {m['k']} draft "
                     f"tokens a round, the drafter ending a block before a token whose drafter probability is below "
                     f"{m['confidence']:g}. Fixed-k modes draft exactly k tokens a round.")
            L.append("")
    return L


def _equivalence(eq: dict) -> list[str]:
    """The verdict first: every Tandem output token-identical to the baseline's (and HF's to HF plain's)."""
    L: list[str] = ["## Greedy output equivalence", ""]
    if not eq.get("applicable"):
        L.append(f"Not applicable: {eq['note']}")
    elif eq["ok"]:
        L.append(f"**OK**: all {eq['checked']} outputs of the Tandem modes (every speculative mode, every repeat, "
                 "the baseline's own repeats) are token-identical to the baseline's output for the same prompt.")
    else:
        L.append(f"**MISMATCH — {len(eq['mismatches'])} of {eq['checked']} Tandem outputs differ from the baseline.** "
                 "Speculative decoding must be lossless; every mismatch is listed:")
        L.append("")
        L += table(["mode", "question", "category", "repeat", "first diff at", "tokens (ref)", "output", "baseline"],
                   [[x["mode"], str(x["question_id"]), x["category"], str(x["repeat"]),
                     str(x["first_difference_at"]), f"{x['tokens']} ({x['reference_tokens']})",
                     text_cell(x["text"]), text_cell(x["reference_text"])] for x in eq["mismatches"]])
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
            L += table(["mode", "against", "question", "repeat", "first diff at", "output", "reference"],
                       [[x["mode"], x["against"], str(x["question_id"]), str(x["repeat"]),
                         str(x["first_difference_at"]), text_cell(x["text"]), text_cell(x["reference_text"])]
                        for x in h["mismatches"]])
    L.append("")
    return L


def _memory(results: dict) -> list[str]:
    """Peak RSS of every process."""
    L: list[str] = ["## Peak memory", ""]
    rows = []
    for name, m in (results.get("memory") or {}).items():
        peak = m.get("peak_rss_bytes", m.get("rss_bytes"))
        rows.append([name, fmt_bytes(peak), fmt_bytes(m.get("max_rss_during_run_bytes")),
                     m.get("source", "") + (f" ({m['note']})" if m.get("note") else "")])
    L += table(["process", "peak RSS (incl. model load)", "max RSS sampled in the timed phase", "source"], rows)
    L.append("")
    return L


def _setting(results: dict) -> list[str]:
    """Machine, software, models, services, workload, decoding, warm-up and plan, notes, failures."""
    a = results["analysis"]
    cfg = results["config"]
    env = results["environment"]
    models = results.get("models") or {}
    target = models.get("target") or {}
    drafter = models.get("drafter") or {}
    files = models.get("drafter_files") or {}
    L: list[str] = ["## Setting", ""]
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
             f"`{models.get('target_spec')}`), verifier "
             + (f"at {results['services']['verifier']}." if results['services'].get('verifier')
                else "in the gateway's process."))
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
    return L


def _plots(results: dict) -> list[str]:
    """The PNG plots written beside the report."""
    L: list[str] = ["## Plots", ""]
    for key, title in (("speedup", "Speedup per category"), ("acceptance", "Acceptance by position"),
                       ("time", "Time per round"), ("auto_k", "Auto's choice of k")):
        if key in results.get("plots", {}):
            L.append(f"![{title}]({Path(results['plots'][key]).name})")
            L.append("")
    return L


def write_markdown(results: dict, path: Path) -> None:
    path.write_text(markdown(results))


def console_summary(results: dict) -> str:
    a = results["analysis"]
    o = a["overall"]
    lines = [f"{'mode':<12} {'tok/s':>7} {'speedup':>8} {'tau':>5} {'acc':>5} {'TTFT ms':>8}"]
    for m in results["mode_names"]:
        f = o.get(m, {})
        lines.append(f"{m:<12} {fmt(f.get('tokens_per_s')):>7} {fmt(f.get('speedup'), '{:.2f}x'):>8} "
                     f"{fmt(f.get('mean_acceptance_length')):>5} {fmt(f.get('acceptance_rate')):>5} "
                     f"{fmt(f.get('ttft_ms'), '{:.0f}'):>8}"
                     + (f"  ({f['speedup_vs_hf_plain']:.2f}x vs hf_plain)" if f.get("speedup_vs_hf_plain") else ""))
    eq = a["equivalence"]
    if eq.get("applicable"):
        lines.append(f"greedy equivalence: {'OK' if eq['ok'] else 'MISMATCH'} ({len(eq['mismatches'])} of "
                     f"{eq['checked']} differ)" + (f"; HF: {'OK' if eq['hf']['ok'] else 'MISMATCH'} "
                                                   f"({len(eq['hf']['mismatches'])} of {eq['hf']['checked']})"
                                                   if eq.get("hf") else ""))
    auto = (a.get("auto") or {}).get("per_group", {}).get("overall")
    if auto:
        ch = auto.get("choices") or {}
        share = ", ".join(f"k={k} {100 * v:.0f}%" for k, v in int_keys(ch.get("share_by_k")).items())
        lines.append(f"auto: {fmt(auto.get('speedup_vs_baseline'), '{:.2f}x')} vs plain, "
                     f"{fmt(auto.get('vs_best_fixed'), '{:.2f}x')} vs the best fixed k ({auto.get('best_fixed')}); "
                     f"rounds: {share}; probe {pct(ch.get('probe_share'))}")
    ag = (a.get("llama") or {})
    for m in (M.LLAMA_PLAIN, M.LLAMA_LOOKUP):
        g = (ag.get(m) or {}).get("overall") or {}
        if g.get("prompts"):
            lines.append(f"{m}: {g['identical']}/{g['prompts']} outputs identical to the baseline, common prefix "
                         f"{pct(g.get('common_prefix_share'))} of its tokens")
    lines.append(f"CPU: {results['environment'].get('cpu')}")
    return "\n".join(lines)
