"""The report's sections on the automatic draft length: auto against the best fixed k and plain
decoding, per category and overall, and the share of rounds at each k with the reasons the gateway
gave (``RoundStats.k_reason``).
"""

from __future__ import annotations

from tandem.bench import modes as M
from tandem.bench.tables import fmt, int_keys, pct, ratio_cell, table


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
             "step) to maximise expected tokens per ms from its measured costs (gateway/draft_length/). "
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
        rows.append([f"**{g}**" if g == "overall" else g, str(base.get("prompts", 0)), fmt(base.get("tokens_per_s")),
                     fmt(x.get("tokens_per_s")), ratio_cell(x.get("speedup_vs_baseline")),
                     f"{best} ({fmt(x.get('best_fixed_tokens_per_s'))} tok/s, "
                     f"{fmt(x.get('best_fixed_speedup'), '{:.2f}x')})" if best else "–",
                     ratio_cell(x.get("vs_best_fixed")), ratio_cell(x.get("vs_overall_best_fixed")),
                     pct(ch.get("plain_step_share")), pct(ch.get("probe_share")),
                     fmt(ch.get("mean_k_speculative"), "{:.2f}")])
    L += table(["category", "prompts", "plain tok/s", "auto tok/s", "auto vs plain", "best fixed k",
                "auto / best fixed k", f"auto / {ob or 'best overall k'}", "plain steps", "probe rounds",
                "mean k (speculative rounds)"], rows)
    L.append("")
    L.append("Ratios are of mean tokens/s over the same prompts (per-prompt medians over repeats); ↓ marks auto "
             "slower. *plain steps*: auto's rounds at k = 0; *probe rounds*: rounds whose k_reason was `probe` "
             "(a short block while plain decoding wins).")
    L.append("")
    width = sorted({k for g in groups for k in int_keys((pg.get(g, {}).get("choices") or {}).get("share_by_k"))})
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
            share = int_keys(ch.get("share_by_k"))
            tpr = int_keys(ch.get("tokens_per_round_by_k"))
            rows.append([f"**{g}**" if g == "overall" else g, str(ch.get("rounds", 0))]
                        + [(f"{pct(share[k])} ({tpr[k]:.2f})" if k in share else "–") for k in width]
                        + [pct((ch.get("share_by_reason") or {}).get(r)) for r in reasons])
        L += table(["category", "rounds"] + [f"k={k}" for k in width] + [f"reason {r}" for r in reasons], rows)
        L.append("")
        L.append("Cells: share of rounds (tokens emitted per such round).")
        L.append("")
    return L
