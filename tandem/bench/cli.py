"""``tandem bench``: speculative vs plain decoding on Spec-Bench, with a JSON file, a Markdown report
and plots. See ``tandem.bench`` for the method and BENCHMARKS.md for results."""

from __future__ import annotations

import datetime as _dt
import sys
import time
from pathlib import Path

from tandem.flags import flag

DEFAULT_SWEEP = "1,2,3,4,6,8"
ADAPTIVE_CONFIDENCE = 0.5  # the adaptive mode's confidence stop (the value of the runs in BENCHMARKS.md)


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in str(text).replace(" ", "").split(",") if x]
    except ValueError as exc:
        raise ValueError(f"{what} must be comma-separated integers, got {text!r}") from exc
    return values


def _pairs(text: str | None, what: str, cast=str) -> dict:
    out = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        if "=" not in item:
            raise ValueError(f"{what} takes name=value pairs separated by commas, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = cast(v.strip())
    return out


def configure(p) -> None:
    g = p.add_argument_group("services (default: start drafter, verifier and gateway here, as `tandem up`)")
    flag(g, "gateway", None, help="benchmark live services at this gateway host:port instead of starting them")
    flag(g, "verifier-addr", None, help="live verifier host:port (for model info in the report)")
    flag(g, "drafter-addr", None, help="live drafter host:port (for model info in the report)")
    flag(g, "target", "default", help="target model of the verifier ('default', .gguf or HF dir); also the HF "
         "peer baseline's target")
    flag(g, "drafter", "default", help="drafter directory (model.onnx + drafter.json) for the drafter service; "
         "its drafter.json names the torch weights for HF assisted generation")
    flag(g, "verifier-threads", 1, int, help="torch threads of a started verifier, and of the in-process HF modes "
         "(0: torch's default, one per core; on a shared machine 2 threads on 2 busy cores ran 10-30x slower "
         "than 1)")
    flag(g, "activations", "auto", help="a started verifier's arithmetic on GGUF blocks: 'auto' (the verifier's "
         "default: int8 where most layers are 5-bit or K-quant blocks, else fp32), 'fp32' or 'int8' (tandem up "
         "--activations)")
    flag(g, "separate-verifier", help="started services: the verifier as a service of its own, reached over gRPC "
         "(tandem up --separate-verifier); default: in the gateway's process, as tandem up runs it", cast=bool)
    flag(g, "drafter-threads", 1, int, help="ONNX Runtime threads of a started drafter")
    flag(g, "verifier-cpus", None, help="pin a started verifier and gateway to these CPUs, e.g. '0' (Linux)")
    flag(g, "drafter-cpus", None, help="pin a started drafter to these CPUs, e.g. '1': with --verifier-cpus, the "
         "drafter never takes the verifier's cores (two machines, emulated on one)")
    flag(g, "startup-timeout", 900.0, float, help="seconds to wait for started services")
    flag(g, "pids", None, help="live services on this machine: name=PID,... to measure their peak RSS")
    flag(g, "metrics", None, help="live services: name=URL,... of Prometheus endpoints to read peak RSS from")

    g = p.add_argument_group("modes (baseline = plain decoding through the verifier; auto = the gateway's automatic "
                             "draft length, the default speculative mode; k=N = a pinned draft length, the sweep)")
    flag(g, "no-auto", help="skip the auto mode (GenerateRequest.draft_length 0: the gateway chooses k every round)",
         cast=bool)
    flag(g, "max-draft-length", 8, int, help="auto mode: the longest block auto may draft, given to a gateway the "
         "bench starts (serve-gateway --max-draft-length); a live gateway keeps its own")
    flag(g, "k-sweep", DEFAULT_SWEEP, help="fixed (pinned) draft lengths k to benchmark beside auto: the report "
         "compares auto with the best of them")
    flag(g, "default-k", 2, int, help="the fixed k of the sweep that always runs (beside baseline and auto) and comes "
         "first of the sweep when the time budget is short (if it is in --k-sweep; else the sweep's middle k). "
         "Not the gateway's default draft length: the bench starts the gateway with auto, and pins k per request in the k=N modes")
    flag(g, "adaptive-k", 6, int, help="adaptive mode: the most draft tokens a round (0 = no adaptive mode)")
    flag(g, "draft-confidence", ADAPTIVE_CONFIDENCE, float, help="adaptive mode: the drafter ends a block before "
         "a token whose drafter probability is below this")
    flag(g, "hf-drafter", "auto", help="torch drafter for HF assisted generation: 'auto' (the 'source' in the "
         "drafter's drafter.json), 'none', or an HF dir / .gguf")
    flag(g, "hf-k", 0, int, help="HF assisted: num_assistant_tokens, constant, no early stop (0: HF's defaults)")
    flag(g, "no-hf", help="skip the in-process HF transformers modes", cast=bool)
    flag(g, "no-llama", help="skip llama.cpp: the in-process peers (llama_plain, llama_lookup; need llama-cpp-python: "
         "pip install 'tandem-spec[llama]') and, with --concurrency, llama-server", cast=bool)
    flag(g, "llama-lookup-tokens", 10, int, help="llama.cpp prompt lookup: tokens proposed per step (num_pred_tokens)")
    flag(g, "llama-lookup-ngram", 2, int, help="llama.cpp prompt lookup: the longest n-gram matched (max_ngram_size)")

    g = p.add_argument_group("other sittings (each instead of the mode comparison above, with its own report)")
    flag(g, "versus", help="Tandem through `tandem up` (HTTP and gRPC, plain and auto) against llama.cpp's own "
         "llama-bench (decode, -p 0) and llama-server (the same OpenAI requests) on the target's GGUF, same threads, "
         "interleaved in one sitting (tandem.bench.versus)", cast=bool)
    flag(g, "two-machine", help="the two-machine layout on one host: verifier and gateways on --verifier-cpus "
         "(default 0), drafter on --drafter-cpus (default 1), --delays of added round trip; plain, lookup-only "
         "(no drafter node) and auto per delay (tandem.bench.two_machine)", cast=bool)
    flag(g, "delays", "0,5,20", help="--two-machine: added round trips between gateway and drafter, in ms")
    flag(g, "two-machine-verifier", "local", choices=("local", "shared"), help="--two-machine: 'local' loads the "
         "target in each gateway's process, as tandem up runs it on the target's box; 'shared' runs one verifier "
         "process that every gateway calls over gRPC, as deploy/TWO_MACHINES.md's recipe runs it (a hop each round "
         "that tandem up does not have)")
    flag(g, "two-machine-k", "", help="--two-machine: pinned draft lengths run beside auto on the first drafter "
         "node (its auto mode's gateway and drafter), e.g. 1,2: whether the k policy leaves speed on the table")
    flag(g, "two-machine-variants", "no-ahead", help="--two-machine: comma-separated variants of the first drafter "
         "node's auto mode run beside it: no-ahead (a Propose call per block, --no-draft-ahead), plain-ahead (drafting "
         "ahead during plain steps too, --plain-ahead 3); 'none' for neither")
    flag(g, "drafter-nodes", None, help="--two-machine: ';'-separated drafter nodes compared in the sitting, each a "
         "drafter and its serve-drafter flags, e.g. 'default;default --suffix off;suffix;/models/target.gguf' (a .gguf: "
         "the target's own file drafting with int8 activations; default: --drafter)")
    flag(g, "concurrency", "", help="N clients at once, e.g. 1,2,4,8: aggregate tok/s and p50/p95 inter-token "
         "latency, Tandem plain and auto over HTTP beside llama-server --parallel N (tandem.bench.concurrency)")
    flag(g, "concurrency-requests", 2, int, help="--concurrency: requests each client sends, one after another, at "
         "the highest level; every level sends the same requests (fewer clients each send more)")
    flag(g, "concurrency-rounds", 1, int, help="--concurrency: run the levels this many times over, interleaved "
         "(1,4,8,1,4,8,...): tok/s are medians, each ratio to 1 client pairs a round with its own 1-client run")
    flag(g, "llama-bin-dir", None, help="folder with llama.cpp's llama-bench and llama-server (default: "
         "~/.cache/tandem/llama.cpp/<version>/bin, then PATH; build them with "
         "`python -m tandem.bench.llama_tools build`)")
    flag(g, "llama-bench-runs", 3, int, help="--versus: llama-bench runs spread over the sitting (start, ..., end)")

    g = p.add_argument_group("workload")
    flag(g, "questions", None, help="Spec-Bench-style JSONL (question_id, category, turns) [default: "
         "../shared/data/spec_bench/question.jsonl from the repository root]")
    flag(g, "split", "bench", help="bench: question_id %% 4 != 0 (not used to train the drafter); train: %% 4 == 0; all")
    flag(g, "categories", None, help="comma-separated categories (default: all in the file)")
    flag(g, "limit-per-category", None, int, help="at most this many prompts per category")
    flag(g, "max-tokens", 128, int, help="new tokens per request at most (the same for every mode)")
    flag(g, "temperature", 0.0, float, help="0 = greedy (outputs then must match the baseline token for token)")
    flag(g, "top-k", 0, int, help="sampling: top-k (0 = off)")
    flag(g, "top-p", 1.0, float, help="sampling: top-p (1.0 = off)")
    flag(g, "seed", 0, int, help="sampling: request seed = this + question_id (same in every mode and repeat)")
    flag(g, "ignore-eos", help="always generate max-tokens tokens", cast=bool)

    g = p.add_argument_group("measurement and output")
    flag(g, "repeats", 3, int, help="timed repeats of every (prompt, mode); medians with min/max are reported")
    flag(g, "time-budget", 14.0, float, help="minutes for the whole run: after warm-up, modes whose projected time "
         "does not fit are skipped (baseline and the default k always run; said loudly in the report). 0 = no limit")
    flag(g, "request-timeout", 600.0, float, help="deadline of each request in seconds")
    flag(g, "out", None, help="output directory [default: bench_out/bench-<time>/ in the repository]")
    flag(g, "no-progress", help="no progress bars", cast=bool)
    flag(g, "rerender", None, help="only rewrite report.md and the plots beside this results.json (no measuring)")


def _validate(args) -> None:
    args.k_sweep = sorted(set(_ints(args.k_sweep, "--k-sweep")))
    if not args.k_sweep or min(args.k_sweep) < 1:
        raise ValueError("--k-sweep needs draft lengths >= 1")
    if args.default_k < 1:
        raise ValueError("--default-k is a fixed draft length >= 1 (the auto mode is the gateway's choice; "
                         "--no-auto skips it)")
    if args.max_draft_length < 1:
        raise ValueError("--max-draft-length must be >= 1")
    if args.repeats < 1:
        raise ValueError("--repeats must be >= 1 (3 or more for a meaningful spread)")
    if args.max_tokens < 1:
        raise ValueError("--max-tokens must be >= 1")
    if args.time_budget < 0:
        raise ValueError("--time-budget must be >= 0 (0 = no limit)")
    args.pids = _pairs(args.pids, "--pids", int)
    args.metrics = _pairs(args.metrics, "--metrics")
    args.categories_list = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    args.progress = not args.no_progress
    args.report_margin = 20.0


def run(args) -> int:
    from tandem.bench import modes as M
    from tandem.bench.analysis import analyze
    from tandem.bench.plots import write_plots
    from tandem.bench.report import console_summary, write_json, write_markdown
    from tandem.bench.runner import run_benchmark
    from tandem.bench.workload import DEFAULT_QUESTIONS, TRAIN_MODULUS

    if args.rerender:
        return rerender(Path(args.rerender))
    if sitting_of(args):
        return run_sitting(args)
    t_start = time.perf_counter()
    started = _dt.datetime.now().astimezone()
    _validate(args)
    prompts, run_order, out_dir, settings = _workload(args)
    if args.repeats < 3:
        log(f"[bench] note: --repeats {args.repeats} < 3: the reported spread means little")
    log(f"[bench] {len(prompts)} prompts, {args.max_tokens} new tokens max, "
        f"{'auto and ' if not args.no_auto else ''}fixed k={args.k_sweep}, "
        f"{args.repeats} repeats; writing to {out_dir}")

    results = run_benchmark(args, prompts, run_order, settings, out_dir, t_start, log=log)

    per_cat: dict[str, int] = {}
    for p in prompts:
        per_cat[p.category] = per_cat.get(p.category, 0) + 1
    results.update(
        format="tandem-bench/1",
        command=["tandem", "bench", *sys.argv[2:]] if len(sys.argv) > 1 and sys.argv[1] == "bench" else
        ["tandem", "bench", "(called in-process)"],
        started_at=started.isoformat(timespec="seconds"),
        config={k: v for k, v in vars(args).items() if not callable(v) and k not in ("command",)},
        workload={"questions": str(args.questions or DEFAULT_QUESTIONS), "split": args.split,
                  "split_rule": {"bench": f"question_id % {TRAIN_MODULUS} != 0 (the drafter trains on the rest)",
                                 "train": f"question_id % {TRAIN_MODULUS} == 0 (the drafter's training split)",
                                 "all": "every question"}[args.split],
                  "categories": list(per_cat), "per_category": per_cat, "prompts": len(prompts),
                  "run_order": [p.question_id for p in run_order], "prompt_list": [p.to_dict() for p in prompts]},
    )
    results["mode_names"] = [m["name"] for m in results["modes"]]
    results["analysis"] = analyze(results["samples"], results["mode_names"], results["workload"]["prompt_list"],
                                  settings.greedy)
    try:
        results["plots"] = write_plots(results, out_dir)
    except Exception as exc:  # noqa: BLE001 - a missing matplotlib must not lose the measurements
        results["plots"] = {}
        results["notes"].append(f"plots not written: {type(exc).__name__}: {exc} (pip install matplotlib)")
    results["finished_at"] = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    results["wall_s"] = time.perf_counter() - t_start
    json_path, md_path = out_dir / "results.json", out_dir / "report.md"
    write_markdown(results, md_path)
    write_json(results, json_path)

    log("")
    log(console_summary(results))
    for sk in results["plan"]["skipped"]:
        log(f"[bench] skipped {sk['mode']}: {sk['reason']}")
    log(f"[bench] done in {results['wall_s'] / 60:.1f} min: {md_path}, {json_path}, "
        f"{', '.join(Path(p).name for p in results['plots'].values())}")
    a = results["analysis"]
    eq = a["equivalence"]
    failed = False
    if eq.get("applicable") and not eq["ok"]:
        log(f"[bench] GREEDY MISMATCH: {len(eq['mismatches'])} outputs differ from the baseline:")
        for x in eq["mismatches"]:
            log(f"  {x['mode']} question {x['question_id']} ({x['category']}) repeat {x['repeat']}: first "
                f"difference at token {x['first_difference_at']}")
        failed = True
    if a["errors"]:
        log(f"[bench] {len(a['errors'])} requests FAILED (see the report)")
        failed = True
    if a["fallbacks"]:
        log(f"[bench] {len(a['fallbacks'])} speculative requests ran WITHOUT the drafter (see the report)")
    if M.BASELINE not in results["mode_names"]:
        failed = True
    return 1 if failed else 0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _workload(args):
    """(prompts, their interleaved run order, the output folder (made), the request settings)."""
    from tandem.bench.runner import default_out_dir
    from tandem.bench.settings import Settings
    from tandem.bench.workload import interleave_by_category, load_questions

    prompts = load_questions(args.questions, split=args.split, categories=args.categories_list,
                             limit_per_category=args.limit_per_category)
    out_dir = Path(args.out) if args.out else default_out_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = Settings(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                        seed=args.seed, ignore_eos=args.ignore_eos, timeout_s=args.request_timeout)
    return prompts, interleave_by_category(prompts), out_dir, settings


def rerender(json_path: Path) -> int:
    """Rewrites report.md and the plots of an earlier run from its results.json."""
    import json

    from tandem.bench.plots import write_plots
    from tandem.bench.report import write_markdown

    results = json.loads(json_path.read_text())
    out_dir = json_path.parent
    results["plots"] = write_plots(results, out_dir)
    write_markdown(results, out_dir / "report.md")
    print(f"[bench] rewrote {out_dir / 'report.md'} and {len(results['plots'])} plots", file=sys.stderr)
    return 0


# ---- the other sittings: --versus, --two-machine, --concurrency -------------------------------------
SITTINGS = {  # flag -> (module, run, analyze, markdown)
    "versus": ("tandem.bench.versus", "run_versus", "analyze_versus", "markdown_versus"),
    "two_machine": ("tandem.bench.two_machine", "run_two_machine", "analyze_two_machine", "markdown_two_machine"),
    "concurrency": ("tandem.bench.concurrency", "run_concurrency", "analyze_concurrency", "markdown_concurrency"),
}


def sitting_of(args) -> str | None:
    chosen = [name for name in SITTINGS if getattr(args, name, None)]
    if len(chosen) > 1:
        raise ValueError(f"--{' and --'.join(c.replace('_', '-') for c in chosen)}: one sitting at a time")
    return chosen[0] if chosen else None


def _floats(text: str, what: str) -> list[float]:
    try:
        return [float(x) for x in str(text).replace(" ", "").split(",") if x]
    except ValueError as exc:
        raise ValueError(f"{what} must be comma-separated numbers, got {text!r}") from exc


def run_sitting(args) -> int:
    """One of --versus, --two-machine, --concurrency: its own results.json and report.md."""
    import importlib

    from tandem.bench.report import write_json
    from tandem.bench.workload import DEFAULT_QUESTIONS

    name = sitting_of(args)
    module, run_name, analyze_name, markdown_name = SITTINGS[name]
    mod = importlib.import_module(module)
    _validate(args)
    args.delays_list = _floats(args.delays, "--delays")
    if any(d < 0 for d in args.delays_list):
        raise ValueError("--delays are added round trips in ms, >= 0")
    args.two_machine_ks = sorted(set(_ints(args.two_machine_k, "--two-machine-k")))
    from tandem.bench.two_machine import VARIANTS

    args.two_machine_variants_list = [v for v in (w.strip() for w in args.two_machine_variants.split(","))
                                      if v and v != "none"]
    unknown = [v for v in args.two_machine_variants_list if v not in VARIANTS]
    if unknown:
        raise ValueError(f"--two-machine-variants: unknown {', '.join(unknown)} (known: {', '.join(VARIANTS)}, none)")
    if any(k < 1 for k in args.two_machine_ks):
        raise ValueError("--two-machine-k needs draft lengths >= 1, e.g. 1,2")
    args.concurrency_levels = _ints(args.concurrency, "--concurrency") if args.concurrency else []
    if name == "concurrency" and (not args.concurrency_levels or min(args.concurrency_levels) < 1):
        raise ValueError("--concurrency takes client counts >= 1, e.g. 1,2,4,8")
    if args.concurrency_rounds < 1:
        raise ValueError("--concurrency-rounds must be >= 1")
    if args.concurrency_requests < 1:
        raise ValueError("--concurrency-requests must be >= 1")
    started = _dt.datetime.now().astimezone()
    t0 = time.perf_counter()
    prompts, run_order, out_dir, settings = _workload(args)
    log(f"[bench] --{name.replace('_', '-')}: {len(prompts)} prompts, {args.max_tokens} new tokens max, "
        f"{args.repeats} repeat(s); writing to {out_dir}")
    try:
        results = getattr(mod, run_name)(args, prompts, run_order, settings, out_dir, log=log)
    except (RuntimeError, TimeoutError, FileNotFoundError) as exc:
        log(f"[bench] --{name.replace('_', '-')}: {exc}")
        return 1
    if len(sys.argv) > 1 and sys.argv[1] == "bench":
        command = ["tandem", "bench", *sys.argv[2:]]
    elif sys.argv and sys.argv[0].endswith("versus.py"):
        command = ["python", "-m", "tandem.bench.versus", *sys.argv[1:]]
    else:
        command = ["tandem", "bench", f"--{name.replace('_', '-')}", "(called in-process)"]
    results.update(command=command,
                   started_at=started.isoformat(timespec="seconds"),
                   config={k: v for k, v in vars(args).items() if not callable(v)},
                   workload={"questions": str(args.questions or DEFAULT_QUESTIONS), "split": args.split,
                             "prompts": len(prompts), "run_order": [p.question_id for p in run_order],
                             "prompt_list": [p.to_dict() for p in prompts]})
    results["analysis"] = getattr(mod, analyze_name)(results)
    results["finished_at"] = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    results["wall_s"] = time.perf_counter() - t0
    md = getattr(mod, markdown_name)(results)
    write_json(results, out_dir / "results.json")
    (out_dir / "report.md").write_text(md)
    log("")
    log(md)
    log(f"[bench] done in {results['wall_s'] / 60:.1f} min: {out_dir / 'report.md'}, {out_dir / 'results.json'}")
    a = results["analysis"]
    return 1 if a.get("errors") or a.get("mismatches") else 0
