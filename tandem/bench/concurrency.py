"""``tandem bench --concurrency 1,2,4,8``: N clients at once against ``tandem up``'s HTTP API (plain
and auto) and against ``llama-server --parallel N`` (its slots, with continuous batching, llama.cpp's
default) on the same GGUF, the same streamed requests.

At each level N, each system in turn (llama-server is started anew with ``--parallel N``): a warm-up
request, then N client threads start together, each sending its requests one after another. Every level
sends the same requests (``client_sequences``): ``--concurrency-requests`` per client at the highest level,
so fewer clients each send more, and each level's throughput is set against one client's on the same
prompts. Figures per (level,
system): aggregate tokens/s = all new tokens / the time from the first send to the last reply; per
request TTFT and time per output token after the first (p50, p95 over requests); inter-token latency
(each chunk's gap spread over its tokens, ``tandem.bench.http_stream``) p50 and p95 over all tokens.

``--concurrency-rounds R`` runs the levels R times over (1, 4, 8, 1, 4, 8, ...): throughputs are the
median of the rounds, and each ratio to one client pairs a round with that round's own 1-client run (on a
shared host the speed of the same code moves by up to 2x within minutes; a ratio across two moments says
more about the host than about batching).

With all N in flight: the same throughput and inter-token latency over the window in which every client
has a request open (from the last client's first send to the first client's last reply), the tokens that
arrived inside it. The whole-run figure also counts the start, when prompts arrive together, and the end,
when clients whose requests ran shorter have stopped and fewer sessions share each forward: a level of N
clients then runs part of its time with fewer. The window is what N sessions at once get.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

from tandem.bench import figures as F
from tandem.bench.http_stream import chat_body, decode_figures, one_off, percentile, stream_chat

LLAMA = "llama-server"
PLAIN, AUTO = "tandem-plain", "tandem-auto"


def client_sequences(run_order: list, clients: int, per_client: int, most: int | None = None) -> list[list]:
    """Each client's prompts at a level of ``clients``. Every level sends the same requests: the run order,
    wrapping, ``most`` x ``per_client`` of them (``most``: the highest level; default ``clients``), dealt out
    in turn, so that client i sends requests i, i + clients, ... A level's throughput is then set against one
    client's over the same prompts (with the prompts of a level picked apart, one client sent only the first
    few, short ones, while 8 clients also sent the long summarization and RAG prompts, whose prefill
    lowered their ratio)."""
    n, most = len(run_order), max(clients, most or clients)
    pool = [run_order[j % n] for j in range(most * per_client)]
    return [pool[i::clients] for i in range(clients)]


def run_level(send, sequences: list[list], level: int, system: str) -> list[dict]:
    """Runs every client's sequence in its own thread, all starting together; returns the samples (with
    ``start_s``/``end_s`` from the common start)."""
    samples: list[dict] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(sequences))
    t0 = [0.0]

    def client(i: int, seq: list) -> None:
        barrier.wait()
        if i == 0:
            t0[0] = time.perf_counter()
        for j, prompt in enumerate(seq):
            start = time.perf_counter()
            s = send(prompt)
            end = time.perf_counter()
            s.update(mode=system, level=level, client=i, request=j, question_id=prompt.question_id,
                     category=prompt.category, repeat=0, start_abs=start, end_abs=end)
            with lock:
                samples.append(s)

    threads = [threading.Thread(target=client, args=(i, seq), daemon=True) for i, seq in enumerate(sequences)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = min((s["start_abs"] for s in samples), default=0.0)
    for s in samples:
        s["start_s"], s["end_s"] = s.pop("start_abs") - first, s.pop("end_abs") - first
    return samples


def all_in_flight(samples: list[dict]) -> tuple[float, float] | None:
    """The window (s from the level's start) in which every client has a request open: from the last
    client's first send to the first client's last reply; None where it is empty."""
    clients: dict = {}
    for s in samples:
        first, last = clients.get(s.get("client", 0), (float("inf"), float("-inf")))
        clients[s.get("client", 0)] = (min(first, s["start_s"]), max(last, s["end_s"]))
    if not clients:
        return None
    a, b = max(f for f, _ in clients.values()), min(e for _, e in clients.values())
    return (a, b) if b > a else None


def _tokens_in(samples: list[dict], window: tuple[float, float]) -> tuple[int, list[float]]:
    """Tokens whose chunk arrived inside ``window`` and their inter-token latencies (the chunk's gap spread
    over its tokens; a request's first chunk has no gap and adds its tokens only)."""
    a, b = window
    tokens, itl = 0, []
    for s in samples:
        times, counts = s.get("chunk_ms") or [], s.get("chunk_tokens") or []
        for i, (t, n) in enumerate(zip(times, counts)):
            if a <= s["start_s"] + t / 1e3 <= b:
                tokens += n
                if i:
                    itl.extend([(t - times[i - 1]) / n] * n)
    return tokens, itl


def _throughput(ok: list[dict]) -> dict:
    """One run of a level (one round): tokens, wall_s, aggregate_tps, and over the all-in-flight window
    steady_s, steady_tps and that window's inter-token latencies (``_itl``)."""
    span = max(s["end_s"] for s in ok) - min(s["start_s"] for s in ok)
    tokens = sum(s.get("new_tokens") or 0 for s in ok)
    out = {"tokens": tokens, "wall_s": span, "aggregate_tps": tokens / span if span > 0 else None, "_itl": []}
    window = all_in_flight(ok)
    if window is not None:
        inside, out["_itl"] = _tokens_in(ok, window)
        out.update(steady_s=window[1] - window[0], steady_tps=inside / (window[1] - window[0]))
    return out


def _median(xs: list) -> float | None:
    """The median of the figures that exist (None: none does)."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def level_figures(samples: list[dict]) -> dict:
    """A level's figures for one system. Over several rounds (``round`` in the samples: the level run again
    later in the sitting) the throughputs are the median of the rounds' (each round's in ``per_round``);
    latency percentiles pool every request."""
    ok = [s for s in samples if "error" not in s]
    out: dict = {"requests": len(samples), "errors": len(samples) - len(ok)}
    if not ok:
        return out
    rounds = sorted({s.get("round", 0) for s in ok})
    per = {r: _throughput([s for s in ok if s.get("round", 0) == r]) for r in rounds}
    for key in ("tokens", "wall_s", "aggregate_tps", "steady_s", "steady_tps"):
        value = _median([f.get(key) for f in per.values()])
        if value is not None:
            out[key] = value
    if len(rounds) > 1:
        out["per_round"] = {str(r): {"aggregate_tps": f["aggregate_tps"], "steady_tps": f.get("steady_tps")}
                            for r, f in per.items()}
    inside_itl = [x for f in per.values() for x in f["_itl"]]
    itl: list[float] = []
    tpot: list[float] = []
    for s in ok:
        f = decode_figures(s)
        itl += f["itl_ms"]
        if f["decode_tps"]:
            tpot.append(1e3 / f["decode_tps"])
    ttft = [s["ttft_ms"] for s in ok if s.get("ttft_ms") is not None]
    out.update(itl_p50_ms=percentile(itl, 50), itl_p95_ms=percentile(itl, 95),
               tpot_p50_ms=percentile(tpot, 50), tpot_p95_ms=percentile(tpot, 95),
               ttft_p50_ms=percentile(ttft, 50), ttft_p95_ms=percentile(ttft, 95))
    if "steady_tps" in out:
        out.update(steady_itl_p50_ms=percentile(inside_itl, 50), steady_itl_p95_ms=percentile(inside_itl, 95))
    return out


def tandem_modes(args) -> list[str]:
    """Tandem's systems at each level: plain decoding, and auto unless ``--no-auto``."""
    return [PLAIN] + ([] if getattr(args, "no_auto", False) else [AUTO])


def llama_server_plan(args) -> tuple[object, object, str]:
    """(llama.cpp's tools, the target's GGUF, '') when llama-server runs beside Tandem at each level; else
    (None, None, why not: --no-llama, no llama.cpp build, or a target that is not a GGUF file)."""
    from tandem.bench import llama_peer
    from tandem.bench.llama_tools import find_tools, missing_message

    if getattr(args, "no_llama", False):
        return None, None, "llama-server not run (--no-llama)"
    tools = find_tools(getattr(args, "llama_bin_dir", None))
    if tools is None:
        return None, None, missing_message()
    gguf, why = llama_peer.gguf_path(args.target)
    if gguf is None:
        return None, None, f"llama-server not run: {why}"
    return tools, gguf, ""


FORWARD_FIGURES = {"tandem:forward_sessions_sum": "sessions", "tandem:forward_sessions_count": "forwards",
                   'tandem:forward_rows_sum{kind="verify"}': "rows",
                   "tandem:verify_queue_seconds_sum": "queue_s", "tandem:verify_queue_seconds_count": "blocks"}


def metrics_ports() -> int | None:
    """A base port with it and the next two free (``tandem up --metrics-port``'s three), or None."""
    import random

    from tandem.up import port_in_use

    for _ in range(64):
        base = random.randint(20000, 60000)
        if not any(port_in_use(base + i) for i in range(3)):
            return base
    return None


def forward_counters(port: int | None) -> dict:
    """The verifier's running totals behind its batching figures (``FORWARD_FIGURES``), from its Prometheus
    endpoint; {} when it cannot be read (the figures are then left out)."""
    from tandem.bench.prometheus import samples

    if not port:
        return {}
    try:
        found = samples(f"http://127.0.0.1:{port}/metrics", timeout_s=10)
    except OSError:
        return {}
    return {FORWARD_FIGURES[name]: value for name, value in found if name in FORWARD_FIGURES}


def forward_figures(before: dict, after: dict) -> dict:
    """Sessions and rows a verify forward and the mean wait of a block for its forward, over what ran between
    two readings of ``forward_counters``."""
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    if not d.get("forwards"):
        return {}
    return {"forwards": int(d["forwards"]), "sessions_per_forward": d.get("sessions", 0.0) / d["forwards"],
            "rows_per_forward": d.get("rows", 0.0) / d["forwards"],
            "queue_ms": 1e3 * d.get("queue_s", 0.0) / d["blocks"] if d.get("blocks") else None}


def run_concurrency(args, prompts, run_order, settings, out_dir: Path, log=print) -> dict:
    from tandem.bench.environment import environment
    from tandem.bench.llama_server import REQUEST_EXTRA, LlamaServer
    from tandem.bench.runner import start_services
    from tandem.security import default as default_security

    levels = args.concurrency_levels
    per_client = args.concurrency_requests
    threads = args.verifier_threads or 1
    cpus = getattr(args, "verifier_cpus", None)
    results: dict = {"format": "tandem-bench-concurrency/1", "environment": environment(), "notes": [],
                     "levels": levels, "requests_per_client": per_client, "threads": threads, "cpus": cpus}
    tools, gguf, note = llama_server_plan(args)
    if note:
        results["notes"].append(note)
        log(f"[concurrency] {note}")
    else:
        results["tools"] = tools.describe()
        results["gguf"] = str(gguf)
    metrics = metrics_ports()                     # the verifier's batching figures each level (base + 1)
    cluster = start_services(args, out_dir / "service_logs", http_port=0, metrics_port=metrics)
    verifier_metrics = metrics + 1 if metrics else None
    token = default_security().token
    tandem_url = f"http://127.0.0.1:{cluster.http_port}"

    def sender(url, extra=None, tok=None, salted=False):
        return lambda prompt, n=None: F.with_figures(stream_chat(
            url, chat_body(prompt.text, n or settings.max_tokens, temperature=settings.temperature,
                           ignore_eos=settings.ignore_eos, extra={**(extra or {}), **(one_off() if salted else {})}),
            settings.timeout_s, tok))

    samples: list[dict] = []
    results["llama_server"] = {}
    rounds = max(1, int(getattr(args, "concurrency_rounds", 1) or 1))
    results["rounds"] = rounds
    try:
        for rnd, level in ((r, lvl) for r in range(rounds) for lvl in levels):
            seqs = client_sequences(run_order, level, per_client, max(levels))
            extra = {PLAIN: {"no_speculation": True}, AUTO: None}
            systems = [(mode, sender(tandem_url, extra[mode], token, salted=True)) for mode in tandem_modes(args)]
            server = None
            if tools is not None and gguf is not None:
                server = LlamaServer(tools.server, gguf, threads, parallel=level, cpus=cpus,
                                     log_path=out_dir / (f"llama-server-np{level}" + (f"-round{rnd + 1}" if rounds > 1 else "")
                                                        + ".log")).__enter__()
                results["llama_server"][str(level)] = {"command": server.command, "startup_s": server.startup_s}
                systems.insert(0, (LLAMA, sender(server.url, REQUEST_EXTRA)))
            try:
                for name, send in systems:
                    w = send(run_order[0], settings.max_tokens)
                    if "error" in w:
                        raise RuntimeError(f"warm-up request to {name} failed: {w['error']}")
                    log(f"[concurrency] {level} client(s), {sum(map(len, seqs))} requests: {name}"
                        + (f" (round {rnd + 1} of {rounds})" if rounds > 1 else ""))
                    before = forward_counters(verifier_metrics) if name != LLAMA else {}
                    samples += [dict(s, round=rnd) for s in run_level(send, seqs, level, name)]
                    if before:
                        figures = forward_figures(before, forward_counters(verifier_metrics))
                        if figures:
                            results.setdefault("forwards", []).append(dict(figures, level=level, mode=name,
                                                                           round=rnd))
            finally:
                if server is not None:
                    server.stop()
    finally:
        cluster.stop()
    results["tandem"] = {"command": f"tandem up --target {args.target} --drafter {args.drafter} --verifier-threads "
                                    f"{threads} --http-port {cluster.http_port}" + (f" --verifier-cpus {cpus}" if cpus else "")
                                    + (f" --activations {args.activations}" if getattr(args, "activations", None) else "")
                                    + (" --separate-verifier" if getattr(args, "separate_verifier", False) else "")}
    results["samples"] = samples
    return results


def analyze_concurrency(results: dict) -> dict:
    samples = results["samples"]
    out: dict = {}
    for level in results["levels"]:
        row = {}
        for system in (LLAMA, PLAIN, AUTO):
            sel = [s for s in samples if s["level"] == level and s["mode"] == system]
            if sel:
                row[system] = level_figures(sel)
        base = (row.get(LLAMA) or {}).get("aggregate_tps")
        for system in (PLAIN, AUTO):
            if system in row:
                row[system]["vs_llama_server"] = F.ratio(row[system].get("aggregate_tps"), base)
        out[str(level)] = row
    one = out.get("1") or {}
    for row in out.values():                    # each system against its own single client
        for system, f in row.items():
            alone = one.get(system) or {}
            for key, ratio in (("aggregate_tps", "vs_one_client"), ("steady_tps", "steady_vs_one_client")):
                mine, theirs = f.get("per_round"), alone.get("per_round")
                if mine and theirs:             # each round against its own 1-client run: the host moves
                    f[ratio] = _median([F.ratio(mine[r][key], theirs[r][key]) for r in mine if r in theirs])
                else:
                    f[ratio] = F.ratio(f.get(key), alone.get(key))
    for level, row in out.items():              # the verifier's batching, median of the rounds
        for system, f in row.items():
            runs = [x for x in results.get("forwards") or [] if str(x["level"]) == level and x["mode"] == system]
            for key in ("sessions_per_forward", "rows_per_forward", "queue_ms"):
                values = [x[key] for x in runs if x.get(key) is not None]
                if values:
                    f[key] = _median(values)
    return {"levels": out, "outputs": same_outputs(samples)}


def same_outputs(samples: list[dict]) -> dict:
    """Tandem's greedy outputs against themselves: each request's text against plain decoding's of the same
    prompt at the fewest clients it ran with (batching must not change a session's output). Requests that
    failed are left out; ``differ``: (mode, clients, question id) of each text that is not the reference."""
    done = [s for s in samples if s.get("mode") in (PLAIN, AUTO) and "error" not in s and "text" in s]
    reference: dict = {}
    for s in sorted((s for s in done if s["mode"] == PLAIN), key=lambda s: s["level"]):
        reference.setdefault(s["question_id"], (s["level"], s["text"]))
    checked = [s for s in done if s["question_id"] in reference]
    differ = [(s["mode"], s["level"], s["question_id"]) for s in checked if s["text"] != reference[s["question_id"]][1]]
    return {"requests": len(checked), "prompts": len(reference), "differ": differ,
            "alone": sum(1 for lvl, _ in reference.values() if lvl == 1)}


def markdown_concurrency(results: dict) -> str:
    from tandem.bench.tables import table
    from tandem.bench.versus import _f

    cpu = results["environment"].get("cpu_label") or results["environment"].get("cpu", "?")
    L = [f"# Concurrency: {results.get('threads')} thread(s), levels {', '.join(map(str, results['levels']))}", ""]
    rounds = results.get("rounds", 1)
    most = max(results["levels"])
    L.append(f"Run {results.get('started_at', '?')} – {results.get('finished_at', '?')}; CPU **{cpu}**. Every level "
             f"sends the same {most * results['requests_per_client']} requests ({results['requests_per_client']} a "
             f"client at {most} clients; fewer clients each send more, one after another, all clients at once); the "
             "same streamed OpenAI requests to every system."
             + (f" The levels ran {rounds} times over, interleaved: tok/s are medians of the rounds, and each ratio to "
                "1 client the median of the rounds' own ratios." if rounds > 1 else ""))
    L.append("")
    L.append("```")
    L.append(results["tandem"]["command"])
    for lvl, ls in (results.get("llama_server") or {}).items():
        L.append(" ".join(str(x) for x in ls["command"]))
    L.append(" ".join(results.get("command") or []))
    L.append("```")
    L.append("")
    rows = []
    for level, row in results["analysis"]["levels"].items():
        for system, f in row.items():
            rows.append([level, system, f"{f['requests']}" + (f" ({f['errors']} failed)" if f["errors"] else ""),
                         _f(f.get("aggregate_tps")), _f(f.get("vs_one_client"), "{:.2f}x"),
                         _f(f.get("vs_llama_server"), "{:.2f}x"),
                         _f(f.get("steady_tps")), _f(f.get("steady_vs_one_client"), "{:.2f}x"),
                         _f(f.get("steady_itl_p95_ms"), "{:.1f}"),
                         _f(f.get("itl_p50_ms"), "{:.1f}"), _f(f.get("itl_p95_ms"), "{:.1f}"),
                         _f(f.get("tpot_p50_ms"), "{:.1f}"), _f(f.get("tpot_p95_ms"), "{:.1f}"),
                         _f(f.get("ttft_p50_ms"), "{:.0f}"), _f(f.get("ttft_p95_ms"), "{:.0f}"), cpu])
    L += table(["clients", "system", "requests", "aggregate tok/s", "vs 1 client", "vs llama-server",
                "all in flight tok/s", "vs 1 client", "all in flight ITL p95 ms", "ITL p50 ms", "ITL p95 ms",
                "TPOT p50 ms", "TPOT p95 ms", "TTFT p50 ms", "TTFT p95 ms", "CPU"], rows)
    L.append("")
    L.append("aggregate: all new tokens / the time from the first send to the last reply; all in flight: the tokens "
             "that arrived while every client had a request open / that window (the start, and the end when clients "
             "whose requests ran shorter have stopped, left out); vs 1 client: the same system's figure at 1 client. "
             "ITL: inter-token latency, each streamed chunk's gap spread over its tokens, over all tokens of the level "
             "(all in flight: those of the window); "
             "TPOT: a request's time per output token after the first; llama-server runs with `--parallel N` "
             "(continuous batching on, its default).")
    if rounds > 1:
        per = []
        for level, row in results["analysis"]["levels"].items():
            for system, f in row.items():
                rs = f.get("per_round") or {}
                alone = (results["analysis"]["levels"].get("1") or {}).get(system, {}).get("per_round") or {}
                per.append([level, system, ", ".join(_f(rs[r]["aggregate_tps"], "{:.0f}") for r in sorted(rs, key=int)),
                            ", ".join(_f(F.ratio(rs[r]["aggregate_tps"], alone[r]["aggregate_tps"]), "{:.2f}x")
                                      for r in sorted(rs, key=int) if r in alone), cpu])
        L.append("")
        L.append("Per round (in the order run):")
        L.append("")
        L += table(["clients", "system", "aggregate tok/s", "vs that round's 1 client", "CPU"], per)
    batching = [[level, system, _f(f.get("sessions_per_forward"), "{:.2f}"), _f(f.get("rows_per_forward"), "{:.2f}"),
                 _f(f.get("queue_ms"), "{:.2f}"), cpu]
                for level, row in results["analysis"]["levels"].items() for system, f in row.items()
                if f.get("sessions_per_forward") is not None]
    if batching:
        L.append("")
        L.append("The verifier's forwards over each level's requests (its Prometheus counters, read before and after; "
                 "medians of the rounds): sessions and rows a verify forward (rows: drafted rows and prompt slices "
                 "riding along included), and a block's mean wait for its forward:")
        L.append("")
        L += table(["clients", "system", "sessions a forward", "rows a forward", "wait for a forward ms", "CPU"],
                   batching)
    same = results["analysis"].get("outputs")
    if same and same["requests"]:
        L.append("")
        ran = " and ".join(m.removeprefix("tandem-") for m in (PLAIN, AUTO)
                           if any(s.get("mode") == m for s in results["samples"]))
        what = (f"{same['requests']} Tandem requests ({ran}, every level) over {same['prompts']} prompts, each "
                f"against plain decoding of its prompt at the fewest clients it ran with ({same['alone']} of them "
                "alone)")
        L.append(f"Outputs: {what}: " + ("**all identical**." if not same["differ"] else
                 f"**{len(same['differ'])} differ**: " + ", ".join(f"{m} at {lvl} clients, question {q}"
                                                                    for m, lvl, q in same["differ"][:10]) + "."))
    for n in results.get("notes") or []:
        L.append(f"- {n}")
    L.append("")
    return "\n".join(L)
