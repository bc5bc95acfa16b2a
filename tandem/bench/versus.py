"""``tandem bench --versus`` (== ``python -m tandem.bench.versus``): Tandem as users run it against
llama.cpp as users run it, on the same GGUF file with the same thread count, in one sitting.

The services: ``tandem up`` (verifier, drafter, gateway with its OpenAI HTTP API) and ``llama-server
-m FILE -t T --jinja`` (the GGUF's own chat template, as the gateway applies it), both started here (llama-server's
prompt cache off per request: each prompt is sent once per repeat);
``llama-bench -m FILE -t T -n 128 -p 0`` (decode only) run ``--llama-bench-runs`` times spread over
the sitting. The same streamed ``/v1/chat/completions`` request (one user turn, ``max_tokens``,
temperature 0) goes to llama-server and to the gateway's HTTP API; the gateway also answers it over
gRPC (``GenerateStream``, chat). Tandem runs plain (``no_speculation``) and auto (the gateway's
automatic draft length). Per prompt every mode runs in turn (interleaved: load drift hits them alike).

Figures per mode (``tandem.bench.figures``): decode tokens/s (after the first token), request
tokens/s (prefill included) and TTFT; each Tandem figure as a ratio to llama-bench's decode figure
(the median of its runs) and to llama-server's figure on the same prompts; the per-round breakdown
of the gRPC modes; llama-server's agreement with Tandem's greedy text (reported, not required:
llama.cpp quantises activations); and Tandem's own outputs checked equal across its modes.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from tandem.bench import figures as F
from tandem.bench import modes as M
from tandem.bench.http_stream import chat_body, one_off, stream_chat
from tandem.bench.llama_server import REQUEST_EXTRA

LLAMA_SERVER = "llama-server"
HTTP_PLAIN, HTTP_AUTO = "tandem-http-plain", "tandem-http-auto"
GRPC_PLAIN, GRPC_AUTO = "tandem-grpc-plain", "tandem-grpc-auto"
MODES = (LLAMA_SERVER, HTTP_PLAIN, HTTP_AUTO, GRPC_PLAIN, GRPC_AUTO)
TANDEM_MODES = (HTTP_PLAIN, HTTP_AUTO, GRPC_PLAIN, GRPC_AUTO)
PLAIN_MODES = (HTTP_PLAIN, GRPC_PLAIN)
TARGET_RATIO = 1.2      # the goal: Tandem's plain decoding at least this much faster than llama.cpp's


def bench_points(steps: int, runs: int) -> list[int]:
    """Where llama-bench runs among ``steps`` interleaved prompt steps: before step i for each i
    listed (``steps`` = after the last), ``runs`` times spread evenly from the start to the end."""
    if runs <= 0:
        return []
    if runs == 1:
        return [0]
    return sorted({round(i * steps / (runs - 1)) for i in range(runs)})


class Requests:
    """Sends one prompt in one mode: HTTP to llama-server or the gateway, or gRPC to the gateway."""

    def __init__(self, settings, llama_url: str | None, tandem_url: str | None, grpc_runner, token: str | None = None):
        self.settings, self.llama_url, self.tandem_url, self.grpc = settings, llama_url, tandem_url, grpc_runner
        self.token = token

    def body(self, prompt, extra: dict | None = None, max_tokens: int | None = None) -> dict:
        s = self.settings
        return chat_body(prompt.text, max_tokens or s.max_tokens, temperature=s.temperature, ignore_eos=s.ignore_eos,
                         extra=extra)

    def run(self, mode: str, prompt, repeat: int = 0, max_tokens: int | None = None) -> dict:
        base = {"mode": mode, "question_id": prompt.question_id, "category": prompt.category, "repeat": repeat}
        if mode == LLAMA_SERVER:
            s = stream_chat(self.llama_url, self.body(prompt, REQUEST_EXTRA, max_tokens), self.settings.timeout_s)
        elif mode in (HTTP_PLAIN, HTTP_AUTO):
            extra = {"no_speculation": True, **one_off()} if mode == HTTP_PLAIN else one_off()
            s = stream_chat(self.tandem_url, self.body(prompt, extra, max_tokens), self.settings.timeout_s, self.token)
        else:
            m = M.BASELINE_MODE if mode == GRPC_PLAIN else M.AUTO_MODE
            s = self.grpc.run(m, prompt, self.settings, repeat, max_tokens=max_tokens)
        s.update(base)
        return F.with_figures(s)


def run_versus(args, prompts, run_order, settings, out_dir: Path, log=print) -> dict:
    """Starts ``tandem up`` and llama-server, runs the sitting; returns the raw results."""
    from tandem.bench import llama_peer
    from tandem.bench.environment import environment
    from tandem.bench.llama_server import LlamaServer, llama_bench
    from tandem.bench.llama_tools import find_tools, missing_message
    from tandem.bench.gateway_runner import GatewayRunner, fetch_info
    from tandem.bench.runner import progress_bar, service_address, start_services
    from tandem.security import default as default_security

    tools = find_tools(getattr(args, "llama_bin_dir", None))
    if tools is None:
        raise RuntimeError(missing_message())
    gguf, why = llama_peer.gguf_path(args.target)
    if gguf is None:
        raise RuntimeError(f"--versus needs a GGUF target (llama.cpp reads only GGUF): {why}")
    threads = args.verifier_threads or 1
    cpus = getattr(args, "verifier_cpus", None)
    results: dict = {"format": "tandem-bench-versus/1", "environment": environment(), "notes": [],
                     "tools": tools.describe(), "gguf": str(gguf), "threads": threads, "cpus": cpus}
    log(f"[versus] llama.cpp tools: {tools.bench.parent} ({results['tools'].get('version') or '?'}); {gguf.name}, "
        f"{threads} thread(s)" + (f", pinned to CPUs {cpus}" if cpus else ""))
    t0 = time.perf_counter()
    cluster = start_services(args, out_dir / "service_logs", http_port=0)
    gw = None
    try:
        results["tandem"] = {"startup_s": time.perf_counter() - t0, "http_port": cluster.http_port,
                             "grpc": f"127.0.0.1:{cluster.ports['gateway']}",
                             "command": f"tandem up --target {args.target} --drafter {args.drafter} "
                             f"--verifier-threads {threads} --http-port {cluster.http_port}"
                             + (f" --activations {args.activations}" if getattr(args, "activations", None) else "")
                             + (" --separate-verifier" if getattr(args, "separate_verifier", False) else "")
                             + (f" --verifier-cpus {cpus}" if cpus else "")
                             + (f" --drafter-cpus {args.drafter_cpus}" if getattr(args, "drafter_cpus", None) else "")}
        results["models"] = fetch_info(service_address(cluster, "verifier"), service_address(cluster, "drafter"),
                                       service_address(cluster, "gateway"))
        gw = GatewayRunner(f"127.0.0.1:{cluster.ports['gateway']}")
        with LlamaServer(tools.server, gguf, threads, cpus=cpus, log_path=out_dir / "llama-server.log") as server:
            results["llama_server"] = {"command": server.command, "startup_s": server.startup_s}
            req = Requests(settings, server.url, f"http://127.0.0.1:{cluster.http_port}", gw,
                           token=default_security().token)
            warm = run_order[0]
            for mode in MODES:                     # first-call costs of every process, untimed
                s = req.run(mode, warm, max_tokens=settings.max_tokens)
                if "error" in s:
                    raise RuntimeError(f"warm-up request to {mode} failed: {s['error']}")
            steps = [(r, p) for r in range(args.repeats) for p in run_order]
            at = bench_points(len(steps), getattr(args, "llama_bench_runs", 3))
            bench_runs: list[dict] = []
            samples: list[dict] = []

            def run_llama_bench(step: int) -> None:
                log(f"[versus] llama-bench -t {threads} -n {settings.max_tokens} -p 0 (step {step} of {len(steps)})")
                b = llama_bench(tools.bench, gguf, threads, n_gen=settings.max_tokens, cpus=cpus)
                b["at_step"] = step
                bench_runs.append(b)
                if "error" in b:
                    log(f"[versus] llama-bench failed: {b['error']}")

            bar = progress_bar(len(steps) * len(MODES), "versus", getattr(args, "progress", True))
            for i, (repeat, prompt) in enumerate(steps):
                if i in at:
                    run_llama_bench(i)
                for mode in MODES:
                    bar.set_postfix_str(f"r{repeat + 1} q{prompt.question_id} {mode}")
                    s = dict(req.run(mode, prompt, repeat), step=i)
                    if "error" in s:
                        log(f"[versus] ERROR {mode} q{prompt.question_id}: {s['error']}")
                    samples.append(s)
                    bar.update()
            bar.close()
            if len(steps) in at:
                run_llama_bench(len(steps))
        results["llama_bench"] = bench_runs
        results["samples"] = samples
        return results
    finally:
        if gw is not None:
            gw.close()
        cluster.stop()


def paired_with_llama_bench(samples: list[dict], bench_runs: list[dict], mode: str) -> list[float]:
    """Each of ``mode``'s decode figures against the llama-bench runs that bracket its prompt step (the last run
    before it and the first after it, their mean): ratios of moments minutes apart would carry the host's
    drift (its speed moves by up to 2x within minutes), these carry only a prompt's neighbourhood. A sample
    without its ``step`` (results written before it was recorded) pairs by its place in the sitting."""
    runs = sorted((b["at_step"], b["tokens_per_s"]) for b in bench_runs
                  if b.get("tokens_per_s") and b.get("at_step") is not None)
    out = []
    for index, sample in enumerate(samples):
        if sample.get("mode") != mode or "error" in sample or not sample.get("decode_tps"):
            continue
        step = sample.get("step", index // len(MODES))
        before = [tps for at, tps in runs if at <= step][-1:]
        after = [tps for at, tps in runs if at > step][:1]
        around = before + after
        if around:
            out.append(sample["decode_tps"] / (sum(around) / len(around)))
    return out


def analyze_versus(results: dict) -> dict:
    samples = results["samples"]
    bench_ok = [b["tokens_per_s"] for b in results.get("llama_bench") or [] if b.get("tokens_per_s")]
    bench = statistics.median(bench_ok) if bench_ok else None
    present = [m for m in MODES if any(s.get("mode") == m and "error" not in s for s in samples)]
    out: dict = {"llama_bench_decode_tps": bench, "llama_bench_runs": bench_ok, "modes": {}}
    for m in present:
        row: dict = {}
        for metric in F.METRICS:
            qs = F.common_prompts(samples, [m, LLAMA_SERVER] if LLAMA_SERVER in present else [m], metric)
            row[metric] = F.mode_figure(samples, m, metric, qs)
            row[f"llama_server_{metric}"] = F.mode_figure(samples, LLAMA_SERVER, metric, qs)
            row["prompts"] = len(qs)
        row["vs_llama_bench"] = F.ratio(row["decode_tps"], bench)
        paired = paired_with_llama_bench(samples, results.get("llama_bench") or [], m)
        row["vs_llama_bench_paired"] = statistics.median(paired) if paired else None
        row["vs_llama_bench_paired_range"] = [min(paired), max(paired)] if paired else None
        row["vs_llama_server_decode"] = F.ratio(row["decode_tps"], row["llama_server_decode_tps"])
        row["vs_llama_server_request"] = F.ratio(row["request_tps"], row["llama_server_request_tps"])
        row["rounds"] = F.round_breakdown(samples, m)
        origins: dict[str, int] = {}
        for s in samples:
            if s.get("mode") == m:
                for k, v in (s.get("origins") or {}).items():
                    origins[k] = origins.get(k, 0) + v
        row["origins"] = origins or None
        out["modes"][m] = row
    out["targets"] = {m: {"vs_llama_bench": out["modes"][m]["vs_llama_bench"],
                          "vs_llama_server_request": out["modes"][m]["vs_llama_server_request"],
                          "met": all((x or 0) >= TARGET_RATIO for x in (out["modes"][m]["vs_llama_bench"],
                                                                         out["modes"][m]["vs_llama_server_request"]))}
                      for m in PLAIN_MODES if m in out["modes"]}
    out["agreement"] = {m: F.text_agreement(samples, m, GRPC_PLAIN) for m in (LLAMA_SERVER,) if m in present}
    out["tandem_equal"] = {m: F.text_agreement(samples, m, GRPC_PLAIN) for m in TANDEM_MODES
                           if m in present and m != GRPC_PLAIN}
    # Tandem's greedy text is the same whatever the API and the draft length: a difference is a bug
    out["mismatches"] = [m for m, g in out["tandem_equal"].items() if g["identical"] != g["prompts"]]
    out["errors"] = [{k: s.get(k) for k in ("mode", "question_id", "repeat", "error")} for s in samples if "error" in s]
    return out


def _f(x, fmt="{:.2f}") -> str:
    return "–" if x is None else fmt.format(x)


def markdown_versus(results: dict) -> str:
    from tandem.bench.tables import table

    a = results["analysis"]
    cpu = results["environment"].get("cpu_label") or results["environment"].get("cpu", "?")
    cfg = results.get("config") or {}
    L = [f"# Tandem vs llama.cpp as users run it: {Path(results['gguf']).name}, {results['threads']} thread(s)", ""]
    L.append(f"Run {results.get('started_at', '?')} – {results.get('finished_at', '?')}; CPU **{cpu}**; load "
             f"average at the start {results['environment'].get('load_average_start')}. Every figure below was "
             "measured in this one sitting, the modes interleaved prompt by prompt.")
    L.append("")
    L.append("Commands:")
    L.append("")
    lb = (results.get("llama_bench") or [{}])[0].get("command")
    L.append("```")
    if lb:
        L.append(" ".join(str(x) for x in lb))
    L.append(" ".join(str(x) for x in (results.get("llama_server") or {}).get("command", [])))
    L.append((results.get("tandem") or {}).get("command", ""))
    L.append(" ".join(results.get("command") or []))
    L.append("```")
    L.append("")
    L.append(f"llama-bench decode (`-p 0 -n {cfg.get('max_tokens', 128)}`), median of "
             f"{len(a['llama_bench_runs'])} runs across the sitting: **{_f(a['llama_bench_decode_tps'])} tok/s** "
             f"(runs: {', '.join(_f(x) for x in a['llama_bench_runs'])}; CPU {cpu}).")
    L.append("")
    rows = []
    for m, r in a["modes"].items():
        span = r.get("vs_llama_bench_paired_range")
        rows.append([m, str(r["prompts"]), _f(r["decode_tps"]), _f(r["request_tps"]), _f(r["ttft_ms"], "{:.0f}"),
                     _f(r["vs_llama_bench"], "{:.2f}x"),
                     _f(r.get("vs_llama_bench_paired"), "{:.2f}x") + (f" [{span[0]:.2f}–{span[1]:.2f}]" if span else ""),
                     _f(r["vs_llama_server_decode"], "{:.2f}x"), _f(r["vs_llama_server_request"], "{:.2f}x"), cpu])
    L += table(["mode", "prompts", "decode tok/s", "request tok/s", "TTFT ms", "vs llama-bench decode",
                "vs the llama-bench runs around each prompt", "vs llama-server decode", "vs llama-server request",
                "CPU"], rows)
    L.append("")
    L.append("decode tok/s: tokens after the first / time from the first streamed token to the last; request tok/s: "
             "tokens / the request's wall time (prefill included). Ratios compare the same prompts (mean of "
             "per-prompt medians over repeats). vs the llama-bench runs around each prompt: each request's decode "
             "against the mean of the llama-bench runs just before and just after its prompt, the median over "
             "requests [min–max] (`--llama-bench-runs` as many as the prompts, plus one, pairs every prompt "
             "closely).")
    L.append("")
    t = a.get("targets") or {}
    if t:
        L.append(f"Goal: plain decoding through `tandem up` >= {TARGET_RATIO}x llama-bench's decode and >= "
                 f"{TARGET_RATIO}x llama-server on the same requests (CPU {cpu}): "
                 + "; ".join(f"{m}: {_f(x['vs_llama_bench'], '{:.2f}x')} / {_f(x['vs_llama_server_request'], '{:.2f}x')}"
                             f" — {'met' if x['met'] else '**not met**'}" for m, x in t.items()) + ".")
        L.append("")
    rb = [(m, r["rounds"]) for m, r in a["modes"].items() if r.get("rounds")]
    if rb:
        L.append("## Per-round breakdown (gRPC modes, decode rounds)")
        L.append("")
        L += table(["mode", "rounds", "tokens/round", "verify ms", "draft ms", "overhead ms", "round ms",
                    "ms/token", "CPU"],
                   [[m, str(r["rounds"]), _f(r["tokens_per_round"]), _f(r["verify_ms_per_round"]),
                     _f(r["draft_ms_per_round"]), _f(r["overhead_ms_per_round"]), _f(r["round_ms_per_round"]),
                     _f(r["ms_per_token"]), cpu] for m, r in rb])
        L.append("")
        L.append("Mean ms per round as the gateway measures them: the verifier's and the drafter's compute, and the "
                 "rest of the round (network, serialisation, queuing, the gateway's own work).")
        L.append("")
    L.append("## Outputs")
    L.append("")
    for m, g in (a.get("agreement") or {}).items():
        L.append(f"- {m} vs Tandem's greedy text ({GRPC_PLAIN}): {g['identical']}/{g['prompts']} identical, common "
                 f"prefix {_f(100 * g['common_prefix_share'] if g['common_prefix_share'] is not None else None, '{:.0f}')}% "
                 "of the characters on average (llama.cpp quantises activations: reported, not required).")
    for m, g in (a.get("tandem_equal") or {}).items():
        ok = g["identical"] == g["prompts"]
        L.append(f"- {m} vs {GRPC_PLAIN}: {g['identical']}/{g['prompts']} identical texts"
                 + ("" if ok else " — **Tandem's modes must agree: a mismatch is a bug**") + ".")
    for m, r in a["modes"].items():
        if r.get("origins"):
            L.append(f"- {m}: tokens by origin " + ", ".join(f"{k} {v}" for k, v in sorted(r["origins"].items())) + ".")
    L += F.failure_lines(a, results.get("notes"))
    L.append("")
    return "\n".join(L)


def main(argv: list[str] | None = None) -> int:
    """``python -m tandem.bench.versus [tandem bench flags]``: ``tandem bench --versus``."""
    import argparse

    from tandem.bench import cli

    p = argparse.ArgumentParser(prog="python -m tandem.bench.versus", description=__doc__.split("\n\n")[0])
    cli.configure(p)
    args = p.parse_args(argv)
    args.versus = True
    return cli.run(args)


if __name__ == "__main__":
    import sys

    sys.exit(main())
