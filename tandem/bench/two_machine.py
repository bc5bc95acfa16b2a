"""``tandem bench --two-machine``: what the drafter node is worth, with the two-machine layout simulated
on one host.

Layout: the verifier (1 torch thread) and every gateway pinned to ``--verifier-cpus`` (default CPU
0), the drafter to ``--drafter-cpus`` (default CPU 1). ``--two-machine-verifier local`` (the default)
loads the target in each gateway's process, as ``tandem up`` runs it on the target's box: no gRPC hop
between gateway and verifier; ``shared``: one verifier process that every gateway calls over gRPC (a hop
of about 2 ms a round here, which plain decoding pays every token and a speculative round once for its
block). Between each speculative gateway and the drafter sits a delay relay
(``tandem.bench.delay_relay``, pinned with the drafter: the drafter's link) adding half of the round
trip in each direction; one gateway per added round trip (``--delays``, default 0, 5 and 20 ms; 0 still
goes through a relay). Modes, interleaved prompt by prompt over gRPC:

* ``plain``: plain decoding (``no_speculation``) on the verifier's CPU alone: the baseline;
* ``lookup-only``: a gateway started ``--lookup-only``: no drafter node, blocks copied by prompt
  lookup over the sequence: what speculation gives without the drafter box;
* ``auto@Dms``: auto draft length with the drafter node behind D ms of added round trip;
* ``--two-machine-variants`` (``VARIANTS``), the first node's auto mode with one gateway flag changed, each
  where the gateway has that flag: ``no-ahead@Dms`` (the default variant) with ``--no-draft-ahead`` (a Propose
  call per block instead of a block drafted while the last one was verified); ``plain-ahead@Dms`` with
  ``--plain-ahead 3`` (the drafter keeps 3 tokens drafted during plain steps too, not only following);
* with ``--drafter-nodes`` (several drafter nodes compared in the sitting, e.g. the shipped drafter and the
  model-free ``suffix`` node), the auto modes of each further node are named ``<node>:auto@Dms``; the
  variants run for the first node only;
* with ``--two-machine-k 1,2``: ``k=K@Dms``, a pinned draft length on the first node's auto gateway and
  drafter (the same processes as ``auto@Dms``), to see what the k policy leaves on the table.

Each auto mode has a drafter process of its own, so a node that learns from traffic (suffix drafting) learns
only from the prompts its own mode sent; and each request carries its own ``cache_salt``, so the verifier
prefills every prompt whole in every mode (``tandem.bench.http_stream.one_off``).

Per mode: tokens/s (request and decode), ratios to plain and to lookup-only, the rounds by where
their block came from (``RoundStats.source``: copy, ahead, wait, propose, or none: a plain step),
the hit rate = rounds whose block the drafter had ready ("ahead") / rounds with a drafter block
(ahead, wait or propose), and the accepted tokens by block source (target tokens = emitted -
accepted: the recovered or bonus token of each round); and where the time goes (``time_split``): the first
token's share, a plain round's verify (slower in a drafting mode than in ``plain`` where the drafter's work
slowed the shared host's forward), the plain rounds after a rejected block, gateway and wire ms a round.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tandem.bench import figures as F
from tandem.bench import modes as M
from tandem.bench.workload import Prompt

PLAIN, LOOKUP_ONLY = "plain", "lookup-only"
WARM_UP_PROMPT = "Describe a quiet morning in a small harbour town, in a few sentences."
DRAFTED = ("ahead", "wait", "propose")        # blocks from the drafter node
DEFAULT_DELAYS = "0,5,20"


# variant of the first node's auto mode -> the gateway flags it adds
VARIANTS = {"no-ahead": ("--no-draft-ahead",), "plain-ahead": ("--plain-ahead", "3")}


def auto_name(delay_ms: float, variant: str = "auto") -> str:
    return f"{variant}@{delay_ms:g}ms"


def gateway_flags() -> set[str]:
    """The option strings ``tandem serve-gateway`` accepts here."""
    from gateway.cli import configure

    p = argparse.ArgumentParser()
    configure(p)
    return {s for a in p._actions for s in a.option_strings}


def drafter_nodes(spec: str | None, drafter: str) -> list[tuple[str, list[str]]]:
    """The drafter nodes of the sitting: (label, serve-drafter flags) for each ';'-separated entry of
    ``spec`` (a drafter name or path, then its flags: "default --suffix off"); [``drafter``] when empty."""
    import shlex

    out = []
    for entry in [e.strip() for e in (spec or "").split(";") if e.strip()] or [drafter]:
        words = shlex.split(entry)
        flags = words if words[0].startswith("--") else ["--drafter", *words]
        if "--drafter" not in flags:
            flags = ["--drafter", drafter, *flags]
        out.append((entry, flags))
    if len({label for label, _ in out}) < len(out):
        raise ValueError(f"--drafter-nodes names a node twice: {spec!r}")
    return out


def start_relay(to: str, delay_ms: float, cpus: str | None, log_dir: Path) -> tuple[subprocess.Popen, int]:
    """A delay relay to ``to`` holding each byte ``delay_ms`` / 2 each way; (the process, its port)."""
    from tandem import spawn

    port_file = log_dir / f"relay-{delay_ms:g}ms.port"
    port_file.unlink(missing_ok=True)
    proc = spawn.popen([sys.executable, "-m", "tandem.bench.delay_relay", "--listen", "127.0.0.1",
                        "--port-file", str(port_file), "--to", to, "--delay-ms", str(delay_ms / 2)],
                       cpus=cpus, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                       stderr=open(log_dir / f"relay-{delay_ms:g}ms.log", "w"))  # noqa: SIM115
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            return proc, int(port_file.read_text())
        if proc.poll() is not None:
            raise RuntimeError(f"the delay relay exited with code {proc.returncode} (log: {log_dir})")
        time.sleep(0.05)
    proc.kill()
    raise TimeoutError("the delay relay did not start within 60 s")


def run_two_machine(args, prompts, run_order, settings, out_dir: Path, log=print) -> dict:
    from tandem.bench.environment import environment
    from tandem.bench.gateway_runner import GatewayRunner, fetch_info
    from tandem.bench.runner import progress_bar
    from tandem.up import Cluster

    v_cpus, d_cpus = args.verifier_cpus or "0", args.drafter_cpus or "1"
    delays = args.delays_list
    log_dir = out_dir / "service_logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    has = gateway_flags()
    if "--lookup-only" not in has:
        raise RuntimeError("this gateway has no --lookup-only flag: the lookup-only mode cannot run")
    wanted = getattr(args, "two_machine_variants_list", ["no-ahead"])
    variants = ["auto"] + [v for v in wanted if VARIANTS[v][0] in has]
    results: dict = {"format": "tandem-bench-two-machine/1", "environment": environment(), "notes": [],
                     "verifier_cpus": v_cpus, "drafter_cpus": d_cpus, "delays_ms": delays,
                     "relay": "userspace TCP relay (tandem.bench.delay_relay) pinned to the drafter's CPUs, holding "
                              "each byte half the added round trip in each direction"}
    for v in wanted:
        if v not in variants:
            results["notes"].append(f"{v} modes not run: this gateway has no {VARIANTS[v][0]}")
    nodes = Cluster(log_dir)
    node_specs = drafter_nodes(getattr(args, "drafter_nodes", None), args.drafter)
    results["drafter_nodes"] = [label for label, _ in node_specs]
    # One drafter process per auto mode: a node that learns from its traffic (suffix drafting) must not draft
    # a prompt's answer from another mode's run of the same prompt (the modes are interleaved prompt by prompt).
    auto_modes = [((f"{label}:" if i else "") + auto_name(d, variant), i, d, variant)
                  for d in delays for i, (label, _) in enumerate(node_specs)
                  for variant in (variants if i == 0 else ["auto"])]
    drafter_clusters = [Cluster(log_dir / f"drafter-{j}") for j in range(len(auto_modes))]
    gateways: list[tuple[str, Cluster]] = []
    relays: list[subprocess.Popen] = []
    runners: dict[str, object] = {}
    try:
        t0 = time.perf_counter()
        activations = results["activations"] = getattr(args, "activations", None)
        results["verifier"] = getattr(args, "two_machine_verifier", "local")
        local = results["verifier"] == "local"
        target_flags = ["--target", args.target, "--threads", str(args.verifier_threads or 1),
                        *(["--activations", activations] if activations else [])]
        if not local:
            nodes.spawn("verifier", [*target_flags, "--cpus", v_cpus], label="verifier")
        for (name, i, _, _), cluster in zip(auto_modes, drafter_clusters):
            cluster.log_dir.mkdir(parents=True, exist_ok=True)
            cluster.spawn("drafter", [*node_specs[i][1], "--threads", str(args.drafter_threads), "--cpus", d_cpus],
                          label=f"drafter for {name}")
        deadline = time.monotonic() + args.startup_timeout
        if not local:
            nodes.wait_up(["verifier"], deadline)
        for cluster in drafter_clusters:
            cluster.wait_up(["drafter"], deadline)
        verifier = None if local else f"127.0.0.1:{nodes.ports['verifier']}"
        drafters = [f"127.0.0.1:{c.ports['drafter']}" for c in drafter_clusters]
        common = [*(["--verifier", "local", *target_flags] if local else ["--verifier", verifier]),
                  "--draft-length", "auto", "--max-draft-length", str(args.max_draft_length),
                  "--http-port", "-1", "--cpus", v_cpus]
        specs: list[tuple[str, list[str]]] = [(LOOKUP_ONLY, [*common, "--lookup-only", "--drafter", ""])]
        for (name, _, d, variant), drafter, cluster in zip(auto_modes, drafters, drafter_clusters):
            proc, port = start_relay(drafter, d, d_cpus, cluster.log_dir)
            relays.append(proc)
            specs.append((name, [*common, "--drafter", f"127.0.0.1:{port}", *VARIANTS.get(variant, ())]))
        for name, flags in specs:
            gw = Cluster(log_dir / "".join(c if c.isalnum() or c in "-_." else "-" for c in name))
            gw.log_dir.mkdir(parents=True, exist_ok=True)
            gw.spawn("gateway", flags, label=f"gateway {name}")
            gateways.append((name, gw))
            if local:           # one at a time: each times its target's forwards at start-up on the shared CPU
                gw.wait_up(["gateway"], deadline)
        for name, gw in gateways:
            gw.wait_up(["gateway"], deadline)
            runners[name] = GatewayRunner(f"127.0.0.1:{gw.ports['gateway']}")
        results["models"] = fetch_info(verifier, drafters[0], f"127.0.0.1:{gateways[0][1].ports['gateway']}")
        results["startup_s"] = time.perf_counter() - t0
        results["gateway_commands"] = {name: ["tandem", "serve-gateway", *flags] for name, flags in specs}
        runners[PLAIN] = runners[LOOKUP_ONLY]
        modes = [PLAIN, LOOKUP_ONLY] + [n for n, _ in specs if n != LOOKUP_ONLY]
        mode_of = {PLAIN: M.BASELINE_MODE}
        for d in delays:                     # pinned k on the first node's auto gateway (and so its drafter)
            for k in getattr(args, "two_machine_ks", []):
                name = f"k={k}@{d:g}ms"
                runners[name], mode_of[name] = runners[auto_name(d)], M.spec_mode(k)
                modes.append(name)

        def run(name, prompt, repeat=0, max_tokens=None):
            s = runners[name].run(mode_of.get(name, M.AUTO_MODE), prompt, settings, repeat, max_tokens=max_tokens)
            s["mode"] = name
            return F.with_figures(s)

        # warm-up: connections, first calls, cost figures; on a prompt outside the workload, so a node that
        # learns from traffic has not seen one of the measured prompts answered
        warm = Prompt(question_id=-1, category="warm-up", text=WARM_UP_PROMPT)
        for name in modes:
            w = run(name, warm, max_tokens=settings.max_tokens)
            if "error" in w:
                raise RuntimeError(f"warm-up request in mode {name} failed: {w['error']}")
        samples = []
        steps = [(r, p) for r in range(args.repeats) for p in run_order]
        bar = progress_bar(len(steps) * len(modes), "two-machine", getattr(args, "progress", True))
        for repeat, prompt in steps:
            for name in modes:
                bar.set_postfix_str(f"r{repeat + 1} q{prompt.question_id} {name}")
                s = run(name, prompt, repeat)
                if "error" in s:
                    log(f"[two-machine] ERROR {name} q{prompt.question_id}: {s['error']}")
                samples.append(s)
                bar.update()
        bar.close()
        results["modes"] = modes
        results["samples"] = samples
        return results
    finally:
        for r in runners.values():
            r.close()
        for _, gw in gateways:
            gw.stop()
        for proc in relays:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
        for cluster in drafter_clusters:
            cluster.stop()
        nodes.stop()


def round_sources(samples: list[dict], mode: str) -> dict:
    """Rounds by block source, the hit rate, and accepted tokens by block source (target: the rest)."""
    rounds: Counter = Counter()
    accepted: Counter = Counter()
    target = 0
    for s in samples:
        r = s.get("rounds") if s.get("mode") == mode and "error" not in s else None
        if not r:
            continue
        sources = r.get("source") or [""] * len(r["k"])
        emitted = r.get("emitted") or [a + 1 for a in r["accepted"]]
        for src, acc, em in zip(sources, r["accepted"], emitted):
            rounds[src or "plain"] += 1
            accepted[src or "plain"] += acc
            target += max(0, em - acc)
    drafted = sum(rounds[s] for s in DRAFTED)
    total = sum(rounds.values())
    return {"rounds": dict(rounds), "round_share": {k: v / total for k, v in rounds.items()} if total else {},
            "drafted_rounds": drafted, "hit_rate": rounds["ahead"] / drafted if drafted else None,
            "accepted_by_source": dict(accepted), "target_tokens": target}


def time_split(samples: list[dict], mode: str) -> dict:
    """Where a mode's time goes, pooled over its samples: the first token's share of the requests' wall time
    (no drafter shortens it), the median verify ms of its plain rounds (a one-row forward: beside the baseline's,
    what the drafter's own work on the shared host costs the verifier's forward; two machines share no memory
    bus), the mean plain rounds after a rejected block (the path restarting), and the mean gateway and wire ms
    a round (where the gateway reports them)."""
    first = wall = 0.0
    plain_verify: list[float] = []
    after: list[int] = []
    gateway: list[float] = []
    wire: list[float] = []
    for s in samples:
        if s.get("mode") != mode or "error" in s:
            continue
        first += s.get("ttft_ms") or 0.0
        wall += s.get("wall_ms") or 0.0
        r = s.get("rounds")
        if not r:
            continue
        sources = [x or "plain" for x in (r.get("source") or [""] * len(r["k"]))]
        plain_verify += [v for v, src in zip(r["verify_ms"], sources) if src == "plain"]
        gateway += r.get("gateway_ms") or []
        wire += r.get("wire_ms") or []
        for i, (proposed, accepted) in enumerate(zip(r.get("proposed") or r["k"], r["accepted"])):
            if accepted < proposed:
                j = i + 1
                while j < len(sources) and sources[j] == "plain":
                    j += 1
                after.append(j - i - 1)
    return {"first_token_share": first / wall if wall else None,
            "plain_verify_ms": statistics.median(plain_verify) if plain_verify else None,
            "plain_rounds_after_rejection": statistics.mean(after) if after else None,
            "rejections": len(after),
            "gateway_ms_per_round": statistics.mean(gateway) if gateway else None,
            "wire_ms_per_round": statistics.mean(wire) if wire else None}


def analyze_two_machine(results: dict) -> dict:
    samples = results["samples"]
    modes = results["modes"]
    out: dict = {"modes": {}}
    for m in modes:
        row: dict = {}
        for metric in ("request_tps", "decode_tps"):
            qs = F.common_prompts(samples, [m, PLAIN, LOOKUP_ONLY], metric)
            x = F.mode_figure(samples, m, metric, qs)
            row[metric] = x
            row[f"{metric}_vs_plain"] = F.ratio(x, F.mode_figure(samples, PLAIN, metric, qs))
            row[f"{metric}_vs_lookup_only"] = F.ratio(x, F.mode_figure(samples, LOOKUP_ONLY, metric, qs))
            row["prompts"] = len(qs)
        row["sources"] = round_sources(samples, m)
        row["per_round"] = F.round_breakdown(samples, m)
        row["time_split"] = time_split(samples, m)
        out["modes"][m] = row
    base = {x["question_id"]: x.get("token_ids") for x in samples if x["mode"] == PLAIN and x["repeat"] == 0}
    out["mismatches"] = [{"mode": s["mode"], "question_id": s["question_id"], "repeat": s["repeat"]}
                         for s in samples if "error" not in s and s["mode"] != PLAIN
                         and base.get(s["question_id"]) is not None and s.get("token_ids") != base[s["question_id"]]]
    out["errors"] = [{k: s.get(k) for k in ("mode", "question_id", "repeat", "error")} for s in samples if "error" in s]
    return out


def markdown_two_machine(results: dict) -> str:
    from tandem.bench.tables import table
    from tandem.bench.versus import _f

    a = results["analysis"]
    cpu = results["environment"].get("cpu_label") or results["environment"].get("cpu", "?")
    L = ["# Two machines on one host: what the drafter node is worth", ""]
    where = ("in each gateway's process (as `tandem up` runs it)" if results.get("verifier") == "local"
             else "one process, called over gRPC by every gateway")
    L.append(f"Run {results.get('started_at', '?')} – {results.get('finished_at', '?')}; CPU **{cpu}**. Verifier "
             f"(1 thread, {results.get('activations') or 'auto'} activations; {where}) and gateways on CPU "
             f"{results['verifier_cpus']}, drafter on CPU {results['drafter_cpus']}; "
             f"added round trip between gateway and drafter: {', '.join(f'{d:g}' for d in results['delays_ms'])} ms "
             f"({results['relay']}). Greedy; the modes interleaved prompt by prompt.")
    L.append("")
    L.append("```")
    L.append(" ".join(results.get("command") or []))
    for name, cmd in (results.get("gateway_commands") or {}).items():
        L.append(f"# {name}: " + " ".join(cmd))
    L.append("```")
    L.append("")
    rows = []
    for m, r in a["modes"].items():
        src = r["sources"]
        share = src["round_share"]
        acc = src["accepted_by_source"]
        rows.append([m, str(r["prompts"]), _f(r["request_tps"]), _f(r["request_tps_vs_plain"], "{:.2f}x"),
                     _f(r["request_tps_vs_lookup_only"], "{:.2f}x"), _f(r["decode_tps"]),
                     _f(100 * src["hit_rate"] if src["hit_rate"] is not None else None, "{:.0f}%"),
                     " ".join(f"{k} {100 * share[k]:.0f}%" for k in ("plain", "copy", "ahead", "wait", "propose")
                              if share.get(k)) or "–",
                     f"draft {sum(acc.get(k, 0) for k in DRAFTED)}, lookup {acc.get('copy', 0)}, "
                     f"target {src['target_tokens']}", cpu])
    L += table(["mode", "prompts", "tok/s", "vs plain", "vs lookup-only", "decode tok/s", "hit rate",
                "rounds by block source", "tokens by origin", "CPU"], rows)
    L.append("")
    L.append("tok/s: new tokens / request wall time (prefill included); decode tok/s leaves out the first token's wait. "
             "Hit rate: rounds whose drafter block was ready when the round began (`ahead`) / rounds with a drafter "
             "block (`ahead`, `wait`, `propose`). Tokens by origin: accepted tokens of drafter blocks (draft) and of "
             "prompt-lookup copies (lookup), and each round's recovered or bonus token (target).")
    L.append("")
    rows = [[m, _f(100 * t["first_token_share"] if t["first_token_share"] is not None else None, "{:.0f}%"),
             _f(t["plain_verify_ms"]), _f(t["plain_rounds_after_rejection"]) + f" ({t['rejections']})",
             _f(t["gateway_ms_per_round"]), _f(t["wire_ms_per_round"])]
            for m, t in ((m, r.get("time_split")) for m, r in a["modes"].items()) if t]
    if rows:
        L.append("Where the time goes:")
        L.append("")
        L += table(["mode", "first token, of wall time", "plain round's verify ms (median)",
                    "plain rounds after a rejection (rejections)", "gateway ms a round", "wire ms a round"], rows)
        L.append("")
        L.append("A plain round's verify is a one-row forward: where it is slower in a drafting mode than in plain "
                 "decoding, the drafter's own work on this host slowed the verifier's forward (they share one "
                 "memory bus here; two machines do not). Rounds after a rejection are plain until the drafter's "
                 "restarted path arrives. Wire: the Verify call's time beyond the verifier's compute.")
        L.append("")
    if a["mismatches"]:
        L.append(f"**GREEDY MISMATCH: {len(a['mismatches'])} outputs differ from plain decoding** "
                 + "; ".join(f"{x['mode']} q{x['question_id']} r{x['repeat']}" for x in a["mismatches"][:10]))
    else:
        L.append("Greedy outputs: every mode token-identical to plain decoding.")
    L += F.failure_lines(a, results.get("notes"))
    L.append("")
    return "\n".join(L)
