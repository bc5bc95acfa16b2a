"""The report's section on Tandem beside its peers (HF transformers, llama.cpp) on the same machine:
tokens/s and ratios, the peers' agreement with the target's greedy output, and the memory-bandwidth
floor (every weight read once per token) measured in the same run.
"""

from __future__ import annotations

from tandem.bench import modes as M
from tandem.bench.analysis import _ratio
from tandem.bench.memory import fmt_bytes
from tandem.bench.tables import fmt, mode_label, pct, table


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
                  f"{g['mean_reference_tokens']:.1f} tokens ({pct(g.get('common_prefix_share'))})")
        elif m in (M.HF_PLAIN, M.HF_ASSISTED):
            ag = "token-identical checked (above)"
        else:
            ag = "the reference" if m == M.BASELINE else "token-identical (checked above)"
        th = threads.get(m) if m in threads else sv.get("verifier_threads")
        rows.append([mode_label(m), fmt(tps), fmt(_ratio(tps, o.get(M.BASELINE, {}).get("tokens_per_s")), "{:.2f}x"),
                     fmt(_ratio(tps, ref_auto), "{:.2f}x"), fmt(_ratio(tps, ref_best), "{:.2f}x"),
                     fmt(f.get("ttft_ms"), "{:.0f}"), str(th if th is not None else "?"), ag, cpu])
    L += table(["mode", "tokens/s", "vs Tandem baseline", "vs Tandem auto", f"vs Tandem best ({best or '–'})",
                "TTFT ms", "threads", "agreement with the target's greedy output", "CPU"], rows)
    L.append("")
    if M.LLAMA_LOOKUP in modes and M.LLAMA_PLAIN in modes:
        lv = (o.get(M.LLAMA_LOOKUP) or {}).get("speedup_vs_llama_plain")
        lp = (agree.get("lookup_vs_plain") or {}).get("overall") or {}
        L.append(f"- llama.cpp prompt lookup vs llama.cpp plain: {fmt(lv, '{:.2f}x')}; outputs identical to plain's "
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
