"""The repeated-traffic benchmark: plain decoding against speculation with a drafter that learns the
traffic it serves (suffix drafting), over passes of ``tandem.bench.workload.repeated_traffic``.

    python -m tandem.bench.repeated                                   # the model-free node, auto k
    python -m tandem.bench.repeated --drafter default --suffix on     # the shipped model, suffix in front
    python -m tandem.bench.repeated --draft-length 6 --out run.json   # a pinned k, the samples saved

Starts verifier, drafter and gateway (``tandem.up.start_cluster``, the drafter's suffix flags passed in
its environment) and sends each conversation's turns through the gateway's OpenAI chat endpoint twice:
plain (``tandem.speculation`` false: the drafter never sees it) and speculative, alternating which goes
first, greedy. The first pass starts with an empty suffix index (cold: it learns only from the pass's
own earlier requests); later passes send the same conversations again (warm: the drafter has seen the
earlier passes' text). Reports, per pass and category, tok/s of both modes (new tokens / client wall
time, summed; and decode tok/s, the prefill left out), their ratios, the mean acceptance length, and
whether every speculative reply was the plain one's text.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

from tandem.bench.workload import Conversation, repeated_traffic


def chat(port: int, messages: list[dict], max_tokens: int, speculate: bool, draft_length: int,
         timeout_s: float = 600.0) -> dict:
    """One greedy chat completion through the gateway's HTTP API: text, new tokens, wall ms, its statistics."""
    body = {"messages": messages, "temperature": 0, "max_tokens": max_tokens,
            "tandem": {"speculation": speculate, "draft_length": draft_length},
            # each mode its own household: the prefix cache serves a mode only the turns it sent itself
            "cache_salt": "speculative" if speculate else "plain"}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        reply = json.loads(resp.read())
    wall_ms = (time.perf_counter() - t0) * 1e3
    return {"text": reply["choices"][0]["message"]["content"], "tokens": reply["usage"]["completion_tokens"],
            "wall_ms": wall_ms, "tandem": reply.get("tandem", {})}


def run_pass(port: int, conversations: list[Conversation], max_tokens: int, draft_length: int, index: int,
             log=print) -> list[dict]:
    """Every conversation once plain and once speculative, turn by turn (each mode with its own replies in
    the history); one sample per turn and mode."""
    samples = []
    for c_i, conv in enumerate(conversations):
        history = {mode: ([{"role": "system", "content": conv.system}] if conv.system else [])
                   for mode in ("plain", "speculative")}
        order = ("plain", "speculative") if (c_i + index) % 2 == 0 else ("speculative", "plain")
        for t_i, turn in enumerate(conv.turns):
            for mode in order:
                history[mode].append({"role": "user", "content": turn})
                out = chat(port, history[mode], max_tokens, mode == "speculative", draft_length)
                history[mode].append({"role": "assistant", "content": out["text"]})
                samples.append({"pass": index, "conversation": conv.name, "category": conv.category, "turn": t_i,
                                "mode": mode, **out})
        log(f"  pass {index} {conv.name}: " + ", ".join(
            f"{s['mode']} {s['tokens']} tok {s['wall_ms']:.0f} ms" for s in samples[-2 * len(conv.turns):]))
    return samples


def summarize(samples: list[dict]) -> dict:
    """Per pass and category (and 'all'): tok/s of each mode (new tokens / client wall time) and decode tok/s
    (the tokens after the first / the gateway's time after the first token: the prefill, the same in both
    modes, left out), speculative / plain for both, the mean acceptance length (1 + accepted / rounds over
    the pass's speculative requests), replies identical to plain."""
    groups: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        for cat in (s["category"], "all"):
            groups[(s["pass"], cat)][s["mode"]].append(s)
    out: dict = {}
    for (pass_i, cat), by_mode in sorted(groups.items()):
        row = {}
        for mode, items in by_mode.items():
            tokens, ms = sum(s["tokens"] for s in items), sum(s["wall_ms"] for s in items)
            decode_ms = sum(s["tandem"].get("total_ms", 0.0) - s["tandem"].get("ttft_ms", 0.0) for s in items)
            row[f"{mode}_tok_s"] = round(tokens / ms * 1e3, 2) if ms else 0.0
            row[f"{mode}_decode_tok_s"] = round(sum(s["tokens"] - 1 for s in items) / decode_ms * 1e3, 2) \
                if decode_ms > 0 else 0.0
            row[f"{mode}_tokens"] = tokens
        for name, key in (("speedup", "tok_s"), ("decode_speedup", "decode_tok_s")):
            plain = row.get(f"plain_{key}", 0.0)
            row[name] = round(row.get(f"speculative_{key}", 0.0) / plain, 3) if plain else 0.0
        spec = by_mode.get("speculative", [])
        rounds = sum(s["tandem"].get("rounds", 0) for s in spec)
        row["mean_acceptance_length"] = round(1 + sum(s["tandem"].get("accepted", 0) for s in spec) / rounds, 3) \
            if rounds else 0.0
        plain = {(s["conversation"], s["turn"]): s["text"] for s in by_mode.get("plain", [])}
        row["identical"] = f"{sum(plain.get((s['conversation'], s['turn'])) == s['text'] for s in spec)}/{len(spec)}"
        out.setdefault(f"pass {pass_i}", {})[cat] = row
    return out


def select(workload: list[Conversation], per_category: int) -> list[Conversation]:
    """The first ``per_category`` conversations of each category, in workload order (0: all)."""
    taken: dict[str, int] = defaultdict(int)
    out = []
    for conv in workload:
        if not per_category or taken[conv.category] < per_category:
            out.append(conv)
            taken[conv.category] += 1
    return out


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="default", help="the target (default: the default target)")
    p.add_argument("--drafter", default="suffix", help="the drafter node: 'suffix' (model-free, the default), "
                   "'default' or a drafter directory")
    p.add_argument("--suffix", choices=("on", "off"), default="on", help="with a model drafter: suffix drafting "
                   "in front of it")
    p.add_argument("--suffix-scope", choices=("global", "session"), default="global")
    p.add_argument("--draft-length", default="auto", help="'auto' (the gateway's choice each round) or a pinned k")
    p.add_argument("--max-draft-length", type=int, default=8, help="the longest block auto drafts (the gateway's "
                   "--max-draft-length)")
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--per-category", type=int, default=0, help="only the first N conversations of each category "
                   "(0: all)")
    p.add_argument("--verifier-threads", type=int, default=2)
    p.add_argument("--drafter-threads", type=int, default=1)
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--out", default=None, help="write the samples and the summary as JSON here")


def main(argv: list[str] | None = None) -> int:
    from tandem.up import start_cluster

    p = argparse.ArgumentParser(prog="python -m tandem.bench.repeated", description=__doc__.split("\n\n")[0])
    configure(p)
    args = p.parse_args(argv)
    k = 0 if args.draft_length == "auto" else int(args.draft_length)
    conversations = select(repeated_traffic(), args.per_category)
    os.environ.update(TANDEM_SUFFIX=args.suffix, TANDEM_SUFFIX_SCOPE=args.suffix_scope)    # the drafter's flags
    log_dir = Path(tempfile.mkdtemp(prefix="tandem-repeated-"))
    ns = SimpleNamespace(target=args.target, drafter=args.drafter, gateway_port=0, http_port=0, draft_length=0,
                         max_draft_length=args.max_draft_length, draft_confidence=0.0, drafter_threads=args.drafter_threads,
                         verifier_threads=args.verifier_threads, verifier_cpus=None, drafter_cpus=None,
                         startup_timeout=args.startup_timeout, log_dir=str(log_dir))
    cluster = start_cluster(ns)
    samples: list[dict] = []
    try:
        chat(ns.http_port, [{"role": "user", "content": "Hello."}], 8, False, 0)      # warm the target's path
        for i in range(1, args.passes + 1):
            samples += run_pass(ns.http_port, conversations, args.max_tokens, k, i,
                                log=lambda m: print(m, file=sys.stderr, flush=True))
    finally:
        cluster.stop()
    summary = summarize(samples)
    setting = {"drafter": args.drafter, "suffix": args.suffix, "suffix_scope": args.suffix_scope,
               "draft_length": args.draft_length, "max_tokens": args.max_tokens,
               "conversations": len(conversations), "logs": str(log_dir)}
    print(json.dumps({"setting": setting, "summary": summary}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps({"setting": setting, "summary": summary, "samples": samples}, indent=1))
    return 0 if all(row["identical"].split("/")[0] == row["identical"].split("/")[1]
                    for rows in summary.values() for row in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
