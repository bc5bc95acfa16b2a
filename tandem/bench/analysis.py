"""From raw samples to the figures of the report.

Per prompt and mode: the median over repeats of tokens/s, TTFT and wall time, with min and max.
Per group of prompts (a category, or all of them) and mode:

* ``speedup`` = mean over the group's prompts of the mode's per-prompt median tokens/s / the same
  mean for the baseline (Spec-Bench's definition); its spread is the min/max over repeats of the
  same ratio computed from one repeat's samples only.
* acceptance figures pooled over the group's requests: mean acceptance length = 1 + accepted /
  rounds, acceptance rate = accepted / proposed, per position accepted_i / proposed_i.
* time per round pooled: total draft (verify, overhead) ms / total rounds.

Auto (the gateway's automatic draft length): per group, its tokens/s over the best fixed k's of the
same group (``vs_best_fixed``, the k best in that group: an oracle no single setting reaches) and over
the k best overall (``vs_overall_best_fixed``: the one k a user would pin), its speedup over the
baseline, and the share of its rounds at each chosen k (k = 0: a plain step) and of each k_reason
(probe: a short block while plain decoding wins), pooled over the group's requests.

llama.cpp peers: tokens/s like every mode, and their agreement with the Tandem baseline's greedy
output (identical outputs, common prefix of token ids): llama.cpp quantises activations, so outputs
may differ; they are outside the equivalence check.

Greedy equivalence: every sample of every Tandem mode (the baseline's repeats included) must be
token-identical to the baseline's first repeat of the same prompt; HF assisted is compared with HF
plain, and HF plain with the Tandem baseline. Each mismatch is listed with the first differing
position; nothing is averaged.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from tandem.bench import modes as M


def _median(xs):
    return statistics.median(xs) if xs else None


def _mean(xs):
    return sum(xs) / len(xs) if xs else None


def _ratio(a, b):
    return a / b if a is not None and b else None


def ok_samples(samples: list[dict]) -> list[dict]:
    return [s for s in samples if "error" not in s]


def index(samples: list[dict]) -> dict[str, dict[int, list[dict]]]:
    """mode -> question_id -> samples sorted by repeat."""
    out: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for s in ok_samples(samples):
        out[s["mode"]][s["question_id"]].append(s)
    for by_q in out.values():
        for lst in by_q.values():
            lst.sort(key=lambda s: s["repeat"])
    return out


def per_prompt(idx, mode: str, qid: int, baseline: str = M.BASELINE) -> dict | None:
    ss = idx.get(mode, {}).get(qid)
    if not ss:
        return None
    tps = [s["tokens_per_s"] for s in ss]
    row = {"question_id": qid, "category": ss[0]["category"], "repeats": len(ss),
           "tokens_per_s": _median(tps), "tokens_per_s_min": min(tps), "tokens_per_s_max": max(tps),
           "ttft_ms": _median([s["ttft_ms"] for s in ss]), "wall_ms": _median([s["wall_ms"] for s in ss]),
           "new_tokens": ss[0]["new_tokens"], "prompt_tokens": ss[0].get("prompt_tokens")}
    server = [s["server"] for s in ss if "server" in s]
    if server:
        rounds = sum(x["rounds"] for x in server)
        row.update(rounds=server[0]["rounds"],
                   mean_acceptance_length=1 + sum(x["accepted"] for x in server) / rounds if rounds else 1.0,
                   acceptance_rate=_ratio(sum(x["accepted"] for x in server), sum(x["proposed"] for x in server)),
                   draft_ms_per_round=_ratio(sum(x["draft_ms"] for x in server), rounds),
                   verify_ms_per_round=_ratio(sum(x["verify_ms"] for x in server), rounds),
                   overhead_ms_per_round=_ratio(sum(x["overhead_ms"] for x in server), rounds))
    hf = [s["hf"] for s in ss if "hf" in s]
    if hf:
        fw = sum(x["target_forwards"] for x in hf)
        row.update(mean_acceptance_length=sum(s["new_tokens"] for s in ss) / fw if fw else None,
                   target_forwards=hf[0]["target_forwards"])
    base = idx.get(baseline, {}).get(qid)
    if base:
        row["speedup"] = _ratio(row["tokens_per_s"], _median([s["tokens_per_s"] for s in base]))
    return row


def group_figures(idx, mode: str, qids: list[int], baseline: str = M.BASELINE) -> dict:
    """Figures of ``mode`` over the prompts ``qids`` (only those measured in both mode and baseline)."""
    mine, base = idx.get(mode, {}), idx.get(baseline, {})
    qs = [q for q in qids if q in mine and q in base]
    out: dict = {"prompts": len(qs)}
    if not qs:
        return out
    med = lambda ss, key: _median([s[key] for s in ss])
    mean_tps = _mean([med(mine[q], "tokens_per_s") for q in qs])
    base_tps = _mean([med(base[q], "tokens_per_s") for q in qs])
    per_repeat = []
    repeats = {s["repeat"] for q in qs for s in mine[q]}
    for r in sorted(repeats):
        a = [s["tokens_per_s"] for q in qs for s in mine[q] if s["repeat"] == r]
        b = [s["tokens_per_s"] for q in qs for s in base[q] if s["repeat"] == r]
        if len(a) == len(qs) and len(b) == len(qs):
            per_repeat.append(_ratio(_mean(a), _mean(b)))
    samples = [s for q in qs for s in mine[q]]
    out.update(tokens_per_s=mean_tps, baseline_tokens_per_s=base_tps, speedup=_ratio(mean_tps, base_tps),
               speedup_per_repeat=per_repeat, speedup_min=min(per_repeat) if per_repeat else None,
               speedup_max=max(per_repeat) if per_repeat else None,
               ttft_ms=_mean([med(mine[q], "ttft_ms") for q in qs]),
               wall_ms=_mean([med(mine[q], "wall_ms") for q in qs]),
               new_tokens=_mean([mine[q][0]["new_tokens"] for q in qs]),
               prompt_tokens=_mean([mine[q][0].get("prompt_tokens") or 0 for q in qs]))
    server = [s["server"] for s in samples if "server" in s]
    if server:
        rounds = sum(x["rounds"] for x in server)
        accepted, proposed = sum(x["accepted"] for x in server), sum(x["proposed"] for x in server)
        width = max((len(x["proposed_per_position"]) for x in server), default=0)
        acc_pos = [sum(x["accepted_per_position"][i] for x in server if i < len(x["accepted_per_position"]))
                   for i in range(width)]
        prop_pos = [sum(x["proposed_per_position"][i] for x in server if i < len(x["proposed_per_position"]))
                    for i in range(width)]
        out.update(rounds=rounds / len(server), mean_acceptance_length=1 + accepted / rounds if rounds else 1.0,
                   acceptance_rate=_ratio(accepted, proposed),
                   acceptance_by_position=[_ratio(a, p) for a, p in zip(acc_pos, prop_pos)],
                   accepted_per_position=acc_pos, proposed_per_position=prop_pos,
                   draft_ms_per_round=_ratio(sum(x["draft_ms"] for x in server), rounds),
                   verify_ms_per_round=_ratio(sum(x["verify_ms"] for x in server), rounds),
                   overhead_ms_per_round=_ratio(sum(x["overhead_ms"] for x in server), rounds),
                   prefill_ms=_mean([x["prefill_ms"] for x in server]),
                   client_overhead_ms=_mean([s["wall_ms"] - s["server"]["total_ms"] for s in samples
                                             if "server" in s]))
        fallbacks = [s for s in samples if "fallback" in s]
        if fallbacks:
            out["fallbacks"] = len(fallbacks)
    hf = [s for s in samples if "hf" in s]
    if hf:
        fw = sum(s["hf"]["target_forwards"] for s in hf)
        out.update(mean_acceptance_length=sum(s["new_tokens"] for s in hf) / fw if fw else None,
                   target_forwards=fw / len(hf))
    return out


def first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def equivalence(idx, modes: list[str], greedy: bool) -> dict:
    if not greedy:
        return {"applicable": False, "note": "sampled decoding (temperature > 0): outputs are not expected to be "
                "token-identical; exactness is the distribution test's business (tests/unit/test_exactness.py)"}
    base = {q: ss[0] for q, ss in idx.get(M.BASELINE, {}).items()}
    hf_plain = {q: ss[0] for q, ss in idx.get(M.HF_PLAIN, {}).items()}

    def compare(mode, against_name, against):
        checked, bad = 0, []
        for q, ss in idx.get(mode, {}).items():
            ref = against.get(q)
            if ref is None:
                continue
            for s in ss:
                if s is ref:
                    continue
                checked += 1
                if s["token_ids"] != ref["token_ids"]:
                    pos = first_difference(s["token_ids"], ref["token_ids"])
                    bad.append({"mode": mode, "against": against_name, "question_id": q, "category": s["category"],
                                "repeat": s["repeat"], "first_difference_at": pos,
                                "tokens": len(s["token_ids"]), "reference_tokens": len(ref["token_ids"]),
                                "text": s["text"][:300], "reference_text": ref["text"][:300]})
        return checked, bad

    tandem_checked, tandem_bad = 0, []
    for m in modes:
        if m in M.PEERS:
            continue
        c, b = compare(m, M.BASELINE, base)
        tandem_checked += c
        tandem_bad += b
    out = {"applicable": True, "reference": "baseline, first repeat", "checked": tandem_checked,
           "mismatches": tandem_bad, "ok": not tandem_bad}
    if M.HF_ASSISTED in idx or M.HF_PLAIN in idx:
        c1, b1 = compare(M.HF_ASSISTED, M.HF_PLAIN, hf_plain)
        c2, b2 = compare(M.HF_PLAIN, M.BASELINE, base)
        out["hf"] = {"checked": c1 + c2, "mismatches": b1 + b2, "ok": not (b1 or b2),
                     "assisted_vs_plain": {"checked": c1, "mismatches": len(b1)},
                     "plain_vs_tandem_baseline": {"checked": c2, "mismatches": len(b2)}}
    return out


def fixed_k_modes(mode_names: list[str]) -> list[str]:
    return [m for m in mode_names if M.fixed_k_of(m) is not None]


def auto_rounds(idx, qids: list[int], mode: str = M.AUTO) -> dict:
    """The auto mode's choices pooled over the requests of ``qids`` (every repeat): rounds at each k (0 =
    a plain step), each k_reason, tokens emitted per k."""
    by_k: dict[int, int] = defaultdict(int)
    reasons: dict[str, int] = defaultdict(int)
    emitted: dict[int, int] = defaultdict(int)
    proposed: dict[int, int] = defaultdict(int)
    accepted: dict[int, int] = defaultdict(int)
    requests = 0
    for q in qids:
        for s in idx.get(mode, {}).get(q, []):
            r = s.get("rounds") or {}
            ks = r.get("k") or []
            if not ks:
                continue
            requests += 1
            why = r.get("k_reason") or [""] * len(ks)
            em = r.get("emitted") or [None] * len(ks)
            for i, k in enumerate(ks):
                by_k[k] += 1
                reasons[why[i] or "none"] += 1
                emitted[k] += em[i] if em[i] is not None else (r["accepted"][i] + 1)
                proposed[k] += r["proposed"][i]
                accepted[k] += r["accepted"][i]
    total = sum(by_k.values())
    if not total:
        return {"rounds": 0, "requests": requests}
    ks = sorted(by_k)
    spec = total - by_k.get(0, 0)
    return {"rounds": total, "requests": requests, "rounds_by_k": {k: by_k[k] for k in ks},
            "share_by_k": {k: by_k[k] / total for k in ks},
            "reasons": dict(reasons), "share_by_reason": {w: n / total for w, n in reasons.items()},
            "probe_share": reasons.get("probe", 0) / total,
            "plain_step_share": by_k.get(0, 0) / total,
            "mean_k_speculative": sum(k * by_k[k] for k in ks) / spec if spec else None,
            "tokens_per_round_by_k": {k: emitted[k] / by_k[k] for k in ks},
            "acceptance_rate_by_k": {k: _ratio(accepted[k], proposed[k]) for k in ks if proposed[k]}}


def auto_comparison(figs: dict, fixed: list[str], overall_best: str | None) -> dict:
    """Auto against the fixed-k modes and the baseline within one group's figures."""
    a = figs.get(M.AUTO, {})
    out: dict = {"speedup_vs_baseline": a.get("speedup"), "tokens_per_s": a.get("tokens_per_s")}
    ranked = [(figs[m]["tokens_per_s"], m) for m in fixed if figs.get(m, {}).get("tokens_per_s") is not None]
    if ranked and a.get("tokens_per_s") is not None:
        best_tps, best = max(ranked)
        out.update(best_fixed=best, best_fixed_tokens_per_s=best_tps, best_fixed_speedup=figs[best].get("speedup"),
                   vs_best_fixed=_ratio(a["tokens_per_s"], best_tps))
        if overall_best and figs.get(overall_best, {}).get("tokens_per_s"):
            out.update(overall_best_fixed=overall_best,
                       vs_overall_best_fixed=_ratio(a["tokens_per_s"], figs[overall_best]["tokens_per_s"]))
    return out


def analyze(samples: list[dict], mode_names: list[str], prompts: list[dict], greedy: bool) -> dict:
    idx = index(samples)
    categories = list(dict.fromkeys(p["category"] for p in prompts))
    qids_by_cat = {c: [p["question_id"] for p in prompts if p["category"] == c] for c in categories}
    all_qids = [p["question_id"] for p in prompts]
    overall = {m: group_figures(idx, m, all_qids) for m in mode_names}
    per_category = {c: {m: group_figures(idx, m, qids_by_cat[c]) for m in mode_names} for c in categories}
    if M.HF_ASSISTED in mode_names and M.HF_PLAIN in mode_names:
        overall[M.HF_ASSISTED]["speedup_vs_hf_plain"] = group_figures(idx, M.HF_ASSISTED, all_qids,
                                                                     M.HF_PLAIN).get("speedup")
        for c in categories:
            per_category[c][M.HF_ASSISTED]["speedup_vs_hf_plain"] = group_figures(
                idx, M.HF_ASSISTED, qids_by_cat[c], M.HF_PLAIN).get("speedup")
    prompts_table = []
    for q in all_qids:
        for m in mode_names:
            row = per_prompt(idx, m, q)
            if row is not None:
                prompts_table.append({"mode": m, **row})
    errors = [{k: s[k] for k in ("mode", "question_id", "category", "repeat", "error")}
              for s in samples if "error" in s]
    fallbacks = [{"mode": s["mode"], "question_id": s["question_id"], "repeat": s["repeat"], "reason": s["fallback"]}
                 for s in samples if "fallback" in s]
    best = max((m for m in mode_names if m != M.BASELINE and overall[m].get("speedup") is not None
                and m not in M.PEERS), key=lambda m: overall[m]["speedup"], default=None)
    out = {"overall": overall, "per_category": per_category, "per_prompt": prompts_table,
           "equivalence": equivalence(idx, mode_names, greedy), "errors": errors, "fallbacks": fallbacks,
           "best_mode": best, "categories": categories}
    fixed = fixed_k_modes(mode_names)
    if M.AUTO in mode_names:
        ranked = [(overall[m]["tokens_per_s"], m) for m in fixed if overall[m].get("tokens_per_s") is not None]
        overall_best = max(ranked)[1] if ranked else None
        groups = {**{c: qids_by_cat[c] for c in categories}, "overall": all_qids}
        out["auto"] = {"overall_best_fixed": overall_best, "fixed_modes": fixed,
                       "per_group": {g: {**auto_comparison(per_category[g] if g != "overall" else overall, fixed,
                                                           overall_best), "choices": auto_rounds(idx, qs)}
                                     for g, qs in groups.items()}}
    llama = [m for m in (M.LLAMA_PLAIN, M.LLAMA_LOOKUP) if m in mode_names]
    if llama:
        from tandem.bench.llama_peer import agreement

        groups = {**{c: qids_by_cat[c] for c in categories}, "overall": all_qids}
        out["llama"] = {m: {g: agreement(idx, m, qs) for g, qs in groups.items()} for m in llama}
        if len(llama) == 2:
            out["llama"]["lookup_vs_plain"] = {g: agreement(idx, M.LLAMA_LOOKUP, qs, M.LLAMA_PLAIN)
                                               for g, qs in groups.items()}
            for g in groups:
                figs = per_category[g] if g != "overall" else overall
                figs[M.LLAMA_LOOKUP]["speedup_vs_llama_plain"] = group_figures(
                    idx, M.LLAMA_LOOKUP, qids_by_cat.get(g, all_qids), M.LLAMA_PLAIN).get("speedup")
    return out
