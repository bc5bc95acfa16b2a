"""The report's tables of figures per mode: the summary over all prompts, per category (speedup, mean
acceptance length, every figure), acceptance by draft position, and per prompt.
"""

from __future__ import annotations

from tandem.bench import modes as M
from tandem.bench.tables import fmt, mode_label, speedup_cell, table


def summary_section(a: dict, modes: list[str]) -> list[str]:
    """Every mode over all prompts: tokens/s, speedup, acceptance, per-round times (``a``: the analysis)."""
    o = a["overall"]
    L: list[str] = ["## Summary (all prompts)", ""]
    rows = []
    for m in modes:
        f = o.get(m, {})
        sp = speedup_cell(f) if m != M.BASELINE else "1.00x"
        if m == M.HF_ASSISTED and f.get("speedup_vs_hf_plain") is not None:
            sp += f"; {f['speedup_vs_hf_plain']:.2f}x vs HF plain"
        rows.append([mode_label(m), fmt(f.get("tokens_per_s")), sp, fmt(f.get("mean_acceptance_length")),
                     fmt(f.get("acceptance_rate")), fmt(f.get("ttft_ms"), "{:.0f}"), fmt(f.get("rounds"), "{:.1f}"),
                     fmt(f.get("draft_ms_per_round"), "{:.1f}"), fmt(f.get("verify_ms_per_round"), "{:.1f}"),
                     fmt(f.get("overhead_ms_per_round"), "{:.1f}"), fmt(f.get("new_tokens"), "{:.1f}")])
    L += table(["mode", "tokens/s", "speedup [per-repeat min–max]", "mean acc. length τ", "acc. rate",
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
    return L


def category_sections(a: dict, modes: list[str]) -> list[str]:
    """Speedup and mean acceptance length per category, then every figure per category and mode."""
    o = a["overall"]
    L: list[str] = ["## Speedup per category", ""]
    spec_modes = [m for m in modes if m not in (M.BASELINE, M.HF_PLAIN)]
    rows = []
    for c in a["categories"] + ["overall"]:
        figs = a["per_category"][c] if c != "overall" else o
        base = figs.get(M.BASELINE, {})
        row = [f"**{c}**" if c == "overall" else c, str(base.get("prompts", 0)), fmt(base.get("tokens_per_s"))]
        for m in spec_modes:
            f = figs.get(m, {})
            row.append(speedup_cell(f, "speedup_vs_hf_plain" if m == M.HF_ASSISTED else "speedup", spread=False))
        rows.append(row)
    L += table(["category", "prompts", "baseline tok/s"] + [
        "HF assisted vs HF plain" if m == M.HF_ASSISTED else m for m in spec_modes], rows)
    L.append("")
    L.append("## Mean acceptance length τ per category")
    L.append("")
    acc_modes = [m for m in modes if m not in (M.BASELINE, M.HF_PLAIN, M.LLAMA_PLAIN, M.LLAMA_LOOKUP)]
    rows = []
    for c in a["categories"] + ["overall"]:
        figs = a["per_category"][c] if c != "overall" else o
        rows.append([c] + [fmt(figs.get(m, {}).get("mean_acceptance_length")) + (
            f" ({fmt(figs[m].get('acceptance_rate'))})" if figs.get(m, {}).get("acceptance_rate") is not None else "")
                           for m in acc_modes])
    L += table(["category"] + [f"{m} τ (rate)" for m in acc_modes], rows)
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
            rows.append([c, mode_label(m), fmt(f.get("tokens_per_s")), fmt(f.get("ttft_ms"), "{:.0f}"),
                         fmt(f.get("mean_acceptance_length")), fmt(f.get("acceptance_rate")),
                         " ".join(fmt(x) for x in pos) if pos else "–", fmt(f.get("draft_ms_per_round"), "{:.1f}"),
                         fmt(f.get("verify_ms_per_round"), "{:.1f}"), fmt(f.get("overhead_ms_per_round"), "{:.1f}"),
                         fmt(f.get("rounds"), "{:.1f}"), fmt(f.get("prompt_tokens"), "{:.0f}")])
    L += table(["category", "mode", "tokens/s", "TTFT ms", "τ", "acc. rate", "acceptance by position",
                "draft ms/round", "verify ms/round", "overhead ms/round", "rounds/req", "prompt tokens"], rows)
    L.append("")
    return L


def position_section(a: dict, modes: list[str]) -> list[str]:
    """Acceptance rate at each draft position, per mode, over all prompts (none without speculative modes)."""
    o = a["overall"]
    L: list[str] = []
    width = max((len(o.get(m, {}).get("acceptance_by_position") or []) for m in modes), default=0)
    if width:
        L.append("## Acceptance by draft position (all prompts)")
        L.append("")
        rows = []
        for m in modes:
            rates = o.get(m, {}).get("acceptance_by_position")
            if rates:
                rows.append([m] + [fmt(r) for r in rates] + ["" for _ in range(width - len(rates))])
        L += table(["mode"] + [str(i + 1) for i in range(width)], rows)
        L.append("")
    return L


def per_prompt_section(a: dict) -> list[str]:
    """Every prompt in every mode: the median over repeats and its spread."""
    L: list[str] = ["## Per prompt", ""]
    rows = []
    for r in a["per_prompt"]:
        rows.append([str(r["question_id"]), r["category"], r["mode"],
                     f"{r['tokens_per_s']:.2f} [{r['tokens_per_s_min']:.2f}–{r['tokens_per_s_max']:.2f}]",
                     fmt(r.get("speedup"), "{:.2f}x"), fmt(r.get("ttft_ms"), "{:.0f}"), str(r.get("prompt_tokens")),
                     str(r["new_tokens"]), fmt(r.get("mean_acceptance_length")), fmt(r.get("acceptance_rate"))])
    L += table(["question", "category", "mode", "tokens/s median [min–max]", "speedup", "TTFT ms", "prompt tokens",
                "new tokens", "τ", "acc. rate"], rows)
    L.append("")
    return L
