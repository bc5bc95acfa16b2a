"""A sitting of ``tandem bench``: the services, the modes, warm-up, the plan under a time budget, the
timed requests (the steps of ``tandem.bench``'s docstring, in ``run_benchmark``).

The requests themselves are the runners': ``gateway_runner`` (Tandem), ``hf_peer`` and ``llama_peer``
(the peers, in this process); ``plan`` decides which modes fit the budget. ``start_services`` and
``progress_bar`` serve the other sittings too (``versus``, ``two_machine``, ``concurrency``).
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

from tandem.bench import modes as M
from tandem.bench.gateway_runner import GatewayRunner, fetch_info
from tandem.bench.hf_peer import HFRunner, drafter_dir_no_export, drafter_metadata, resolve_hf_drafter
from tandem.bench.memory import RssMonitor, scrape_peak_rss, self_peak_rss_bytes
from tandem.bench.plan import auto_unavailable, pick_warmup_prompt, plan_modes, timed_warmup
from tandem.bench.settings import Settings
from tandem.bench.workload import Prompt


def start_services(args, log_dir: Path, http_port: int = -1, metrics_port: int | None = None):
    """The three services as ``tandem up`` starts them (``http_port`` 0: the OpenAI HTTP API on a free
    port, then in ``cluster``'s args; -1: none; ``metrics_port``: Prometheus on it and the next two, as
    ``tandem up --metrics-port``)."""
    from tandem.up import start_cluster

    # the gateway's default draft length must be auto: a request's draft_length 0 means "the gateway's
    # default", so only a gateway started with auto runs the auto mode (fixed-k modes pin their own k)
    ns = SimpleNamespace(target=args.target, drafter=args.drafter, gateway_port=0, draft_length=0,
                         max_draft_length=getattr(args, "max_draft_length", 8), draft_confidence=0.0,
                         drafter_threads=args.drafter_threads, verifier_threads=args.verifier_threads,
                         verifier_cpus=getattr(args, "verifier_cpus", None),
                         drafter_cpus=getattr(args, "drafter_cpus", None), startup_timeout=args.startup_timeout,
                         log_dir=str(log_dir), http_port=http_port, activations=getattr(args, "activations", None),
                         separate_verifier=getattr(args, "separate_verifier", False), metrics_port=metrics_port)
    cluster = start_cluster(ns)
    cluster.http_port = ns.http_port
    return cluster


def service_address(cluster, name: str) -> str | None:
    """host:port of a started service; None for one that has no port of its own (a verifier in the gateway's
    process, a drafter under --lookup-only)."""
    port = cluster.ports.get(name)
    return f"127.0.0.1:{port}" if port else None


def progress_bar(total: int, desc: str, enabled: bool):
    """A tqdm bar of requests on stderr (off with ``enabled`` False; sparse updates when stderr is not a tty)."""
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit="req", file=sys.stderr, disable=not enabled, dynamic_ncols=tty,
                mininterval=0.1 if tty else 15.0)


def run_benchmark(args, prompts: list[Prompt], run_order: list[Prompt], settings: Settings, out_dir: Path,
                  t_start: float, log=print) -> dict:
    """Starts or connects to the services, warms up, plans, runs. Returns the raw results dict."""
    from tandem.bench.environment import environment, load_average

    results: dict = {"environment": environment(), "notes": []}
    notes: list[str] = results["notes"]
    cluster = None
    if args.gateway:
        gateway_addr, verifier_addr, drafter_addr = args.gateway, args.verifier_addr, args.drafter_addr
        services = {"mode": "live", "gateway": gateway_addr, "verifier": verifier_addr, "drafter": drafter_addr}
    else:
        log_dir = out_dir / "service_logs"
        t0 = time.perf_counter()
        cluster = start_services(args, log_dir)
        gateway_addr, verifier_addr, drafter_addr = (service_address(cluster, n)
                                                     for n in ("gateway", "verifier", "drafter"))
        services = {"mode": "started", "startup_s": time.perf_counter() - t0, "logs": str(log_dir),
                    "gateway": gateway_addr, "verifier": verifier_addr, "drafter": drafter_addr,
                    "verifier_threads": args.verifier_threads, "drafter_threads": args.drafter_threads,
                    "verifier_cpus": getattr(args, "verifier_cpus", None),
                    "drafter_cpus": getattr(args, "drafter_cpus", None)}
        gw_cmd = [str(x) for x in (getattr(cluster.procs.get("gateway"), "args", None) or [])]
        services["gateway_command"] = gw_cmd
        if gw_cmd and "--max-draft-length" not in gw_cmd and args.max_draft_length != 8:
            notes.append(f"**--max-draft-length {args.max_draft_length} not applied**: tandem.up.start_cluster does "
                         "not pass it to the gateway, which keeps its default cap for auto (8)")
    results["services"] = services
    gw = None
    try:
        info = fetch_info(verifier_addr, drafter_addr, gateway_addr)
        ddir = drafter_dir_no_export(args.drafter) if (args.drafter or not args.gateway) else None
        meta = drafter_metadata(ddir)
        results["models"] = {"target": info.get("target"), "drafter": info.get("drafter"), "drafter_files": meta,
                             "target_spec": args.target, "drafter_spec": args.drafter}
        if meta and info.get("drafter", {}).get("model_name") and meta.get("model_name") and \
                meta["model_name"] != info["drafter"]["model_name"]:
            notes.append(f"the drafter files ({meta['path']}: {meta['model_name']}) are not the model the live "
                         f"drafter serves ({info['drafter']['model_name']}): HF assisted uses the files")

        # ---- the modes --------------------------------------------------------------------------
        gw = GatewayRunner(gateway_addr)
        want_auto = not getattr(args, "no_auto", False)
        modes: list[M.Mode] = [M.BASELINE_MODE] + ([M.AUTO_MODE] if want_auto else []) + \
            [M.spec_mode(k) for k in args.k_sweep]
        if not want_auto:
            notes.append("auto mode: not run (--no-auto)")
        if gw.adaptive_field and args.adaptive_k:
            modes.append(M.adaptive_mode(args.adaptive_k, args.draft_confidence))
        elif not args.adaptive_k:
            notes.append("adaptive mode: not run (--adaptive-k 0)")
        else:
            notes.append("adaptive mode: not run, this gateway has no adaptive draft length yet "
                         f"(GenerateRequest has none of the fields {', '.join(M.ADAPTIVE_FIELDS)})")
        hf_spec, hf_note = (None, "HF modes not run (--no-hf)") if args.no_hf else \
            resolve_hf_drafter(args.hf_drafter, meta)
        hf_plain = not args.no_hf           # HF generate of the target alone needs no drafter
        if hf_plain:
            target_name = (info.get("target") or {}).get("model_name")
            try:
                from tandem.models import resolve

                hf_target_name = resolve(args.target).name
            except FileNotFoundError as exc:
                hf_spec, hf_plain, hf_note = None, False, f"HF modes skipped: {exc}"
            else:
                if target_name and hf_target_name != target_name:
                    hf_spec, hf_plain = None, False
                    hf_note = (f"HF modes skipped: --target {args.target} ({hf_target_name}) is not the verifier's "
                               f"target ({target_name}); pass the verifier's --target")
        hf_modes = ([M.HF_PLAIN_MODE] if hf_plain else []) + ([M.HF_ASSISTED_MODE] if hf_spec else [])
        llama_gguf, llama_note = _llama_plan(args, info)

        # ---- warm-up: priming, then one untimed request per mode on a mean-length prompt ----------
        # Priming (a few tokens, plain and speculative) takes the first-call costs of every process,
        # so that the per-mode warm-up times are steady-state and fit to project the run's cost.
        warm_prompt = pick_warmup_prompt(prompts)
        n_per_mode = len(run_order) * args.repeats
        budget = lambda: None if not args.time_budget else (
            args.time_budget * 60 - (time.perf_counter() - t_start) - args.report_margin)
        warm_s: dict[str, float] = {}
        prime = min(4, settings.max_tokens)
        bar = progress_bar(len(modes) + 2, "warm-up", args.progress)
        gw.run(M.BASELINE_MODE, warm_prompt, settings, max_tokens=prime)
        gw.run(M.spec_mode(args.default_k if args.default_k in args.k_sweep else args.k_sweep[0]), warm_prompt,
               settings, max_tokens=prime)
        bar.update(2)
        for m in list(modes):
            bar.set_postfix_str(m.name)
            if m.auto:
                t0 = time.perf_counter()
                s = gw.run(m, warm_prompt, settings)
                if "error" in s:
                    raise RuntimeError(f"warm-up request in mode {m.name} failed: {s['error']}")
                why = auto_unavailable(s)
                if why:
                    modes.remove(m)
                    notes.append(f"**auto mode: not run**: {why}")
                    log(f"[bench] auto mode not run: {why}")
                else:
                    warm_s[m.name] = time.perf_counter() - t0
            else:
                warm_s[m.name] = timed_warmup(gw, m, warm_prompt, settings)
            bar.update()
        bar.close()

        # The HF pair needs two more models in this process: load them only if the pair can fit, judged
        # first from the gateway's baseline and default-k warm-ups, then from its own warm-ups.
        hf = None
        if hf_modes:
            k0 = next((m.name for m in M.priority(modes, args.default_k) if M.is_fixed_k(m)), M.BASELINE)
            guess = dict(warm_s, **{M.HF_PLAIN: warm_s[M.BASELINE], M.HF_ASSISTED: warm_s[k0]})
            prio = M.priority(modes + hf_modes, args.default_k)
            kept, _, _ = plan_modes(prio, guess, n_per_mode, budget(), essential=M.essential(prio))
            if not {m.name for m in hf_modes} & {m.name for m in kept}:
                hf_note = ("HF modes skipped without loading: their projected time (estimated from the baseline's "
                           f"and {k0}'s warm-ups) does not fit the time budget; rerun with --time-budget 0")
            else:
                log(f"[bench] loading the target in-process for HF generate (torch drafter: {hf_spec or 'none'})")
                eos = (info.get("target") or {}).get("eos_token_ids")
                hf = HFRunner(args.target, hf_spec, [int(e) for e in eos] if eos else None, args.hf_k,
                              threads=args.verifier_threads)
                for m in hf_modes:
                    hf.run(m, warm_prompt, settings, max_tokens=prime)
                    warm_s[m.name] = timed_warmup(hf, m, warm_prompt, settings)
                modes += hf_modes
                hf_note = f"HF modes: {hf_note}"
        notes.append(hf_note)
        results["hf"] = hf.config() if hf else None

        # llama.cpp on the target's GGUF: cheap to load (mmapped), so loaded, warmed up, then planned
        llama = None
        if llama_gguf is not None:
            try:
                llama = _load_llama(args, llama_gguf, hf, info, prompts, settings)
                for m in (M.LLAMA_PLAIN_MODE, M.LLAMA_LOOKUP_MODE):
                    llama.run(m, warm_prompt, settings, max_tokens=prime)
                    warm_s[m.name] = timed_warmup(llama, m, warm_prompt, settings)
                modes += [M.LLAMA_PLAIN_MODE, M.LLAMA_LOOKUP_MODE]
                llama_note = (f"llama.cpp peers: llama-cpp-python {llama.config()['llama_cpp_python']} on "
                              f"{llama_gguf.name}, {llama.threads} threads, prompt lookup of up to "
                              f"{llama.lookup_tokens} tokens (n-grams <= {llama.lookup_ngram})")
            except Exception as exc:  # noqa: BLE001 - a broken optional peer must not lose the run
                llama = None
                llama_note = f"llama.cpp peers skipped: {type(exc).__name__}: {exc}"
        if llama_note:
            notes.append(llama_note)
            if llama is None:
                log(f"[bench] {llama_note}")
        results["llama"] = llama.config() if llama else {"skipped": llama_note}
        runners = {"gateway": gw, "hf": hf, "llama": llama}

        # the memory-bandwidth floor: weights bytes / read bandwidth measured now (again after the timed phase)
        from tandem.bench.environment import read_bandwidth_gbs, target_weights

        results["floor"] = {"weights": target_weights(args.target),
                            "bandwidth_before": read_bandwidth_gbs(args.verifier_threads)}

        # ---- plan ---------------------------------------------------------------------------------
        elapsed = time.perf_counter() - t_start
        prio = M.priority(modes, args.default_k)
        kept, skipped, projected = plan_modes(prio, warm_s, n_per_mode, budget(), essential=M.essential(prio))
        run_modes = [m for m in modes if m in kept]          # run in the user's order, not priority
        results["plan"] = {"modes": [asdict(m) for m in run_modes], "skipped": skipped,
                           "warmup_prompt": warm_prompt.question_id, "warmup_s": warm_s,
                           "projected_timed_s": projected, "budget_s": args.time_budget * 60 or None,
                           "elapsed_before_timed_s": elapsed, "requests": n_per_mode * len(run_modes)}
        for sk in skipped:
            log(f"[bench] SKIPPED {sk['mode']}: {sk['reason']}")
        log(f"[bench] timed phase: {len(run_modes)} modes x {len(run_order)} prompts x {args.repeats} repeats "
            f"= {n_per_mode * len(run_modes)} requests, projected {projected / 60:.1f} min")

        # ---- timed phase --------------------------------------------------------------------------
        samples: list[dict] = []
        pids = {n: p.pid for n, p in cluster.procs.items()} if cluster else dict(args.pids or {})
        results["load_average_before_timed"] = load_average()
        t_timed = time.perf_counter()
        with RssMonitor(pids) as rss:
            bar = progress_bar(n_per_mode * len(run_modes), "bench", args.progress)
            try:
                for repeat in range(args.repeats):
                    for prompt in run_order:
                        for m in run_modes:
                            bar.set_postfix_str(f"r{repeat + 1} {prompt.category} q{prompt.question_id} {m.name}")
                            s = runners[m.kind].run(m, prompt, settings, repeat)
                            if "error" in s:
                                log(f"[bench] ERROR {m.name} q{prompt.question_id} repeat {repeat}: {s['error']}")
                            samples.append(s)
                            bar.update()
            except KeyboardInterrupt:
                # keep what was measured: the report covers the prompts done in every mode
                results["interrupted"] = f"interrupted after {len(samples)} of {n_per_mode * len(run_modes)} requests"
                notes.append(f"**{results['interrupted']}** (Ctrl-C): the figures cover only the requests done")
                log(f"[bench] {results['interrupted']}; writing the report of what was measured")
            bar.close()
        results["timed_s"] = time.perf_counter() - t_timed
        results["load_average_after_timed"] = load_average()
        results["floor"]["bandwidth_after"] = read_bandwidth_gbs(args.verifier_threads)
        memory = rss.report()
        for name, url in (args.metrics or {}).items():
            if name not in memory:
                memory[name] = scrape_peak_rss(url)
        for name in ("verifier", "drafter", "gateway"):
            memory.setdefault(name, {"source": "n/a", "note": "live service: give --pids or --metrics to measure"})
        if hf is not None or llama is not None:
            what = " and ".join(n for n, r in (("HF", hf), ("llama.cpp", llama)) if r is not None)
            memory[f"bench process ({what} in-process)"] = {"source": "process", "peak_rss_bytes": self_peak_rss_bytes()}
        results["memory"] = memory
        results["samples"] = samples
        results["modes"] = [asdict(m) for m in run_modes]
        return results
    finally:
        if gw is not None:
            gw.close()
        if cluster is not None:
            cluster.stop()


def _llama_plan(args, info: dict) -> tuple[Path | None, str]:
    """(the GGUF for the llama.cpp peers, or None; a note: why not, '' when they run)."""
    from tandem.bench import llama_peer

    if getattr(args, "no_llama", False):
        return None, "llama.cpp peers not run (--no-llama)"
    ok, why = llama_peer.available()
    if not ok:
        return None, why
    gguf, why = llama_peer.gguf_path(args.target)
    if gguf is None:
        return None, why
    target_name = (info.get("target") or {}).get("model_name")
    from tandem.models import resolve

    if target_name and resolve(args.target).name != target_name:
        return None, (f"llama.cpp peers skipped: --target {args.target} ({resolve(args.target).name}) is not the "
                      f"verifier's target ({target_name}); pass the verifier's --target")
    return gguf, ""


def _load_llama(args, gguf: Path, hf, info: dict, prompts: list[Prompt], settings: Settings):
    from tandem.bench.llama_peer import LlamaCppRunner
    from tandem.bench.workload import chat_prompt_ids

    if hf is not None:
        tokenizer = hf.tokenizer
    else:
        from tandem.models import load_tokenizer

        tokenizer = load_tokenizer(args.target)
    eos = (info.get("target") or {}).get("eos_token_ids")
    ids = {p.question_id: chat_prompt_ids(tokenizer, p.text) for p in prompts}
    longest = max(len(x) for x in ids.values())
    n_ctx = max(256, -(-(longest + settings.max_tokens + 16) // 256) * 256)   # with lookup, n_ctx x vocab floats
    runner = LlamaCppRunner(gguf, tokenizer, [int(e) for e in eos] if eos else None, args.verifier_threads, n_ctx,
                            lookup_tokens=getattr(args, "llama_lookup_tokens", 10),
                            lookup_ngram=getattr(args, "llama_lookup_ngram", 2))
    runner._ids_cache.update(ids)
    return runner


def default_out_dir(root: Path | None = None) -> Path:
    from tandem.pb import PACKAGE_ROOT

    base = root or (PACKAGE_ROOT / "bench_out" if (PACKAGE_ROOT / ".git").exists() else Path(tempfile.gettempdir()))
    return base / time.strftime("bench-%Y%m%d-%H%M%S")
