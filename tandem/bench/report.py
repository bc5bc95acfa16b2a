"""The benchmark's outputs: ``results.json`` (every raw figure) and ``report.md`` (the readable part)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from tandem.bench import modes as M
from tandem.bench.analysis import _ratio
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
    return {M.BASELINE: "baseline", M.HF_PLAIN: "HF plain", M.HF_ASSISTED: "HF assisted", M.AUTO: "auto",
            M.LLAMA_PLAIN: "llama.cpp plain", M.LLAMA_LOOKUP: "llama.cpp lookup"}.get(m, m)


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def _ratio_cell(x) -> str:
    if x is None:
        return "–"
    return f"**{x:.2f}x** ↓" if x < 1.0 else f"{x:.2f}x"


def _ks(d: dict | None) -> dict[int, float]:
    """JSON turns int keys into strings: back to ints, sorted."""
    return {int(k): v for k, v in sorted((d or {}).items(), key=lambda kv: int(kv[0]))}


def auto_sections(results: dict, cpu: str) -> list[str]:
    """Auto against the best fixed k and plain decoding, per category and overall, and its choices of k."""
    a = results["analysis"]
    auto = a.get("auto")
    if not auto:
        return []
    L: list[str] = []
    groups = a["categories"] + ["overall"]
    pg = auto["per_group"]
    fixed = auto.get("fixed_modes") or []
    ob = auto.get("overall_best_fixed")
    L.append("## Auto draft length vs fixed k and plain decoding")
    L.append("")
    L.append(f"CPU: {cpu}. `auto` = GenerateRequest.draft_length 0: the gateway chooses every round's k (0 = a plain "
             "step) to maximise expected tokens per ms from its measured costs (gateway/draft_length.py). "
             f"Fixed k run: {', '.join(fixed) or 'none'}; best overall: **{ob or '–'}**. "
             "*best fixed k* is the best of them in that row (an oracle per category); *vs " + (ob or "best overall")
             + "* is against the one k best overall, as one would pin it for every request.")
    L.append("")
    rows = []
    for g in groups:
        x = pg.get(g, {})
        ch = x.get("choices") or {}
        figs = a["per_category"][g] if g != "overall" else a["overall"]
        base = figs.get(M.BASELINE, {})
        best = x.get("best_fixed")
        rows.append([f"**{g}**" if g == "overall" else g, str(base.get("prompts", 0)), _f(base.get("tokens_per_s")),
                     _f(x.get("tokens_per_s")), _ratio_cell(x.get("speedup_vs_baseline")),
                     f"{best} ({_f(x.get('best_fixed_tokens_per_s'))} tok/s, "
                     f"{_f(x.get('best_fixed_speedup'), '{:.2f}x')})" if best else "–",
                     _ratio_cell(x.get("vs_best_fixed")), _ratio_cell(x.get("vs_overall_best_fixed")),
                     _pct(ch.get("plain_step_share")), _pct(ch.get("probe_share")),
                     _f(ch.get("mean_k_speculative"), "{:.2f}")])
    L += _table(["category", "prompts", "plain tok/s", "auto tok/s", "auto vs plain", "best fixed k",
                 "auto / best fixed k", f"auto / {ob or 'best overall k'}", "plain steps", "probe rounds",
                 "mean k (speculative rounds)"], rows)
    L.append("")
    L.append("Ratios are of mean tokens/s over the same prompts (per-prompt medians over repeats); ↓ marks auto "
             "slower. *plain steps*: auto's rounds at k = 0; *probe rounds*: rounds whose k_reason was `probe` "
             "(a short block while plain decoding wins).")
    L.append("")
    width = sorted({k for g in groups for k in _ks((pg.get(g, {}).get("choices") or {}).get("share_by_k"))})
    if width:
        L.append("## Auto's choice of k: share of rounds")
        L.append("")
        L.append(f"CPU: {cpu}. Every round of every auto request (all repeats); k = 0 counts plain steps. Reasons "
                 "(RoundStats.k_reason, as the gateway reports them): e.g. `best` (the most expected tokens per ms), "
                 "`probe` (a short block while plain decoding wins), `no-figures` (no costs measured yet); `pinned` "
                 "would mean the gateway did not choose.")
        L.append("")
        rows = []
        reasons = sorted({r for g in groups for r in ((pg.get(g, {}).get("choices") or {}).get("reasons") or {})})
        for g in groups:
            ch = pg.get(g, {}).get("choices") or {}
            share = _ks(ch.get("share_by_k"))
            tpr = _ks(ch.get("tokens_per_round_by_k"))
            rows.append([f"**{g}**" if g == "overall" else g, str(ch.get("rounds", 0))]
                        + [(f"{_pct(share[k])} ({tpr[k]:.2f})" if k in share else "–") for k in width]
                        + [_pct((ch.get("share_by_reason") or {}).get(r)) for r in reasons])
        L += _table(["category", "rounds"] + [f"k={k}" for k in width] + [f"reason {r}" for r in reasons], rows)
        L.append("")
        L.append("Cells: share of rounds (tokens emitted per such round).")
        L.append("")
    return L


def peer_sections(results: dict, cpu: str) -> list[str]:
    """llama.cpp and HF beside Tandem, with ratios, agreement, and the memory-bandwidth floor."""
    a = results["analysis"]
    o = a["overall"]
    modes = results["mode_names"]
    llama = results.get("llama") or {}
    fl = results.get("floor") or {}
    L: list[str] = ["## Tandem beside its peers (same machine, same prompts)", ""]
    L.append(f"CPU: **{cpu}**; every figure in this table was measured on it in this run, the modes interleaved "
             "per prompt.")
    L.append("")
    ref_auto = o.get(M.AUTO, {}).get("tokens_per_s")
    best = a.get("best_mode")
    ref_best = o.get(best, {}).get("tokens_per_s") if best else None
    agree = a.get("llama") or {}
    rows = []
    order = [M.BASELINE, M.AUTO] + ([best] if best and best not in (M.AUTO,) else []) + \
        [M.HF_PLAIN, M.HF_ASSISTED, M.LLAMA_PLAIN, M.LLAMA_LOOKUP]
    threads = {M.HF_PLAIN: (results.get("hf") or {}).get("torch_threads"),
               M.HF_ASSISTED: (results.get("hf") or {}).get("torch_threads"),
               M.LLAMA_PLAIN: llama.get("threads"), M.LLAMA_LOOKUP: llama.get("threads")}
    sv = results.get("services") or {}
    for m in dict.fromkeys(order):
        if m not in modes:
            continue
        f = o.get(m, {})
        tps = f.get("tokens_per_s")
        g = (agree.get(m) or {}).get("overall") or {}
        if m in (M.LLAMA_PLAIN, M.LLAMA_LOOKUP) and g.get("prompts"):
            ag = (f"{g['identical']}/{g['prompts']} identical; common prefix {g['mean_common_prefix']:.1f} of "
                  f"{g['mean_reference_tokens']:.1f} tokens ({_pct(g.get('common_prefix_share'))})")
        elif m in (M.HF_PLAIN, M.HF_ASSISTED):
            ag = "token-identical checked (above)"
        else:
            ag = "the reference" if m == M.BASELINE else "token-identical (checked above)"
        th = threads.get(m) if m in threads else sv.get("verifier_threads")
        rows.append([_mode_label(m), _f(tps), _f(_ratio(tps, o.get(M.BASELINE, {}).get("tokens_per_s")), "{:.2f}x"),
                     _f(_ratio(tps, ref_auto), "{:.2f}x"), _f(_ratio(tps, ref_best), "{:.2f}x"),
                     _f(f.get("ttft_ms"), "{:.0f}"), str(th if th is not None else "?"), ag, cpu])
    L += _table(["mode", "tokens/s", "vs Tandem baseline", "vs Tandem auto", f"vs Tandem best ({best or '–'})",
                 "TTFT ms", "threads", "agreement with the target's greedy output", "CPU"], rows)
    L.append("")
    if M.LLAMA_LOOKUP in modes and M.LLAMA_PLAIN in modes:
        lv = (o.get(M.LLAMA_LOOKUP) or {}).get("speedup_vs_llama_plain")
        lp = (agree.get("lookup_vs_plain") or {}).get("overall") or {}
        L.append(f"- llama.cpp prompt lookup vs llama.cpp plain: {_f(lv, '{:.2f}x')}; outputs identical to plain's "
                 f"on {lp.get('identical', '?')}/{lp.get('prompts', '?')} prompts (CPU: {cpu}).")
    if llama.get("gguf"):
        L.append(f"- llama.cpp: llama-cpp-python {llama.get('llama_cpp_python')}, `{llama['gguf']}` "
                 f"({fmt_bytes(llama.get('gguf_bytes'))}), {llama.get('threads')} threads (the verifier's count), "
                 f"n_ctx {llama.get('n_ctx')}, prompt lookup {llama.get('lookup')}; {llama.get('setting')}. "
                 "llama.cpp quantises activations too (8-bit activations in its dot products with the quantised "
                 "weights) where Tandem's verifier computes in fp32, so its greedy output may differ from the "
                 "target's: agreement is reported, not required.")
    elif llama.get("skipped"):
        L.append(f"- {llama['skipped']}")
    bws = [b for b in (fl.get("bandwidth_before"), fl.get("bandwidth_after")) if b and b.get("gb_per_s")]
    w = fl.get("weights") or {}
    if bws:
        from tandem.bench.environment import floor as _floor

        bw = max(bws, key=lambda b: b["gb_per_s"])
        fig = _floor(w, bw)
        parts = []
        if fig.get("fp32"):
            parts.append(f"fp32 weights, as the verifier's fp32 GEMMs read them ({fmt_bytes(fig['fp32']['bytes'])}, "
                         f"{w.get('parameters', 0) / 1e6:.0f} M parameters): {fig['fp32']['ms_per_token']:.1f} ms per "
                         f"token = **{fig['fp32']['tokens_per_s']:.1f} tokens/s at most** for plain decoding")
        if fig.get("gguf"):
            parts.append(f"the GGUF tensors, as llama.cpp and the verifier's GGUF kernel (`--gemm gguf`, chosen by "
                         f"'auto' where it measures faster) read them ({fmt_bytes(fig['gguf']['bytes'])}): "
                         f"{fig['gguf']['ms_per_token']:.1f} ms = **{fig['gguf']['tokens_per_s']:.0f} tokens/s**")
        L.append("- **Floor** (every weight read once per token, at the read bandwidth measured in this run: "
                 + " and ".join(f"{b['gb_per_s']:.1f} GB/s {k}" for k, b in (("before", fl.get("bandwidth_before")),
                                                                             ("after", fl.get("bandwidth_after")))
                                if b and b.get("gb_per_s"))
                 + f" the timed phase, {bw.get('threads')} thread(s), {bw.get('method')}; the better one used), "
                 f"CPU {cpu}: " + ("; ".join(parts) or f"the weights' size is unknown ({w.get('note', '?')})")
                 + ". Speculation can beat a floor (several tokens per weight read); plain decoding cannot beat "
                 "the floor of the bytes it reads.")
    elif fl:
        L.append(f"- Floor: not measured ({(fl.get('bandwidth_before') or {}).get('error', 'no bandwidth figure')}).")
    L.append("")
    return L


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
    L += auto_sections(results, cpu)
    L += peer_sections(results, cpu)

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
    acc_modes = [m for m in modes if m not in (M.BASELINE, M.HF_PLAIN, M.LLAMA_PLAIN, M.LLAMA_LOOKUP)]
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
                       ("time", "Time per round"), ("auto_k", "Auto's choice of k")):
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
    auto = (a.get("auto") or {}).get("per_group", {}).get("overall")
    if auto:
        ch = auto.get("choices") or {}
        share = ", ".join(f"k={k} {100 * v:.0f}%" for k, v in _ks(ch.get("share_by_k")).items())
        lines.append(f"auto: {_f(auto.get('speedup_vs_baseline'), '{:.2f}x')} vs plain, "
                     f"{_f(auto.get('vs_best_fixed'), '{:.2f}x')} vs the best fixed k ({auto.get('best_fixed')}); "
                     f"rounds: {share}; probe {_pct(ch.get('probe_share'))}")
    ag = (a.get("llama") or {})
    for m in (M.LLAMA_PLAIN, M.LLAMA_LOOKUP):
        g = (ag.get(m) or {}).get("overall") or {}
        if g.get("prompts"):
            lines.append(f"{m}: {g['identical']}/{g['prompts']} outputs identical to the baseline, common prefix "
                         f"{_pct(g.get('common_prefix_share'))} of its tokens")
    lines.append(f"CPU: {results['environment'].get('cpu')}")
    return "\n".join(lines)
