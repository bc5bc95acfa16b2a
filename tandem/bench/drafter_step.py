"""What a drafted token costs the model drafter, beside a plain target step, measured in one run.

    python -m tandem.bench.drafter_step --drafter drafters/smollm2-135m-instruct --drafter OTHER_DIR \\
        --contexts 100,600,2000 --repeats 5 --target default --target-threads 2

For each drafter (``drafter_service.model_drafter.ModelDrafter``, ``--threads`` ONNX Runtime threads) and
each context length: ms per drafted token for greedy blocks of k tokens (``draft_block`` on a session that
holds the context: the last context token re-fed, then k - 1 steps, as in a round), split into the time
inside ONNX Runtime's run calls and the rest (Python, numpy, KV copies); ms per token to feed n new tokens
after the context (the catch-up of a session that missed rounds, ``_sync``). Beside them the target's plain
step at the same context (``verifier_service.target.Target.verify`` with an empty draft, ``--target-threads``
torch threads). Every configuration is measured in turn within each repeat, so a change in the machine's
load hits all alike; cells are the minimum over repeats. ``--profile`` adds where one drafted token's ONNX
Runtime time goes, by operator type (ORT's profiler).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


class _OrtClock:
    """Sums the seconds spent in an ONNX Runtime session's run calls."""

    def __init__(self, session):
        self.seconds = 0.0
        for name in ("run", "run_with_iobinding"):
            setattr(session, name, self._timed(getattr(session, name)))

    def _timed(self, fn):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
        return run


def _context(drafter, length: int, seed: int = 0) -> list[int]:
    """Token ids the drafter can draft from (draft vocabulary tokens, if it has one)."""
    rng = np.random.default_rng(seed)
    dv = drafter.meta.draft_vocab
    ids = rng.integers(3, 2000 if dv is None else min(2000, len(dv)), size=length)
    return [int(i) for i in (dv[ids] if dv is not None else ids)]


def measure_drafter(drafter, clock: _OrtClock, ids: list[int], length: int, ks: list[int], feeds: list[int],
                    cells: dict, name: str) -> None:
    """One repeat of every draft and feed measurement at one context length (appends ms to ``cells``)."""
    from tandem.types import SamplingParams

    greedy = SamplingParams()
    state = drafter.new_state()
    context = ids[:length]
    drafter._sync(state, context, 1)
    for k in ks:
        clock.seconds = 0.0
        t0 = time.perf_counter()
        drafter.draft_block(state, context, k, greedy)
        total = time.perf_counter() - t0
        cells[(name, length, "draft", k)].append(total * 1e3 / k)
        cells[(name, length, "draft_ort", k)].append(clock.seconds * 1e3 / k)
    for n in feeds:
        drafter._sync(state, context, 1)
        t0 = time.perf_counter()
        drafter._sync(state, ids[:length + n], 1, rollback_to=length)
        cells[(name, length, "feed", n)].append((time.perf_counter() - t0) * 1e3 / n)


def measure_target(target, ids: list[int], length: int, steps: int, cells: dict) -> None:
    from tandem.types import SamplingParams

    target.start("bench", ids[:length], SamplingParams())
    try:
        for _ in range(steps):
            cells[("target", length)].append(target.verify("bench", []).compute_ms)
    finally:
        target.end("bench")


def op_profile(onnx_path: Path, length: int, steps: int = 30) -> dict[str, float]:
    """Microseconds per drafted token by operator type, and of the whole run: ``steps`` one-token runs after
    ``length`` tokens (ORT's profiler, one thread)."""
    from tandem.export_check import ClassicRunner, SharedKVRunner

    meta_path = onnx_path.parent / "drafter.json"
    shared = meta_path.exists() and json.loads(meta_path.read_text()).get("kv_cache") == "shared"
    with tempfile.TemporaryDirectory() as tmp:
        prefix = str(Path(tmp) / "profile")
        runner = (SharedKVRunner(onnx_path, profile_prefix=prefix) if shared
                  else ClassicRunner(onnx_path, profile_prefix=prefix))
        runner.feed(list(range(3, 3 + length)))
        for i in range(steps):
            runner.feed([5 + i])
        events = json.loads(Path(runner.session.end_profiling()).read_text())
    runs = [e for e in events if e.get("name") == "model_run"][-steps:]
    first = runs[0]["ts"] if runs else 0
    by_op: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= first:
            by_op[e["args"].get("op_name", "?")] += e["dur"] / steps
    by_op["(whole run)"] = sum(r["dur"] for r in runs) / max(1, len(runs))
    return dict(by_op)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tandem.bench.drafter_step", description=__doc__.split("\n")[0])
    p.add_argument("--drafter", action="append", default=None, metavar="DIR",
                   help="a model drafter (repeat to compare several; default: the shipped drafter)")
    p.add_argument("--contexts", default="100,600,2000", help="context lengths, comma-separated")
    p.add_argument("--ks", default="1,4,8", help="greedy block lengths, comma-separated")
    p.add_argument("--feeds", default="1,16,128", help="catch-up lengths (new tokens fed at once), comma-separated")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads of each drafter (default 1)")
    p.add_argument("--target", default="default", help="target model spec for the plain step ('none': skip)")
    p.add_argument("--target-threads", type=int, default=2, help="torch threads of the target (default 2)")
    p.add_argument("--target-steps", type=int, default=5, help="plain steps per context and repeat")
    p.add_argument("--profile", action="store_true", help="also print each drafter's ORT time per drafted token "
                   "by operator type (ORT's profiler)")
    p.add_argument("--json", metavar="FILE", help="also write every sample as JSON")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from drafter_service.model_drafter import ModelDrafter
    from tandem.bench.forward_costs import cpu_model
    from tandem.defaults import shipped_drafter

    contexts, ks, feeds = _ints(args.contexts), _ints(args.ks), _ints(args.feeds)
    dirs = [Path(d) for d in (args.drafter or [shipped_drafter()])]
    names = [f"{d.name} ({'shared KV' if _shared(d) else 'classic'})" for d in dirs]
    if len(set(names)) < len(names):
        names = [f"{n} [{i}]" for i, n in enumerate(names)]
    drafters = {n: ModelDrafter(d, threads=args.threads, providers=["CPUExecutionProvider"])
                for n, d in zip(names, dirs)}
    clocks = {n: _OrtClock(d.session) for n, d in drafters.items()}
    ids = _context(next(iter(drafters.values())), max(contexts) + max(feeds) + 1)
    target = None
    if args.target != "none":
        import torch

        from verifier_service import torch_thread
        from verifier_service.target import Target

        torch.set_num_threads(args.target_threads)
        torch_thread.run(torch.set_num_threads, args.target_threads)
        target = Target.load(args.target, warmup=False)
    cells: dict = defaultdict(list)
    for rep in range(args.repeats + 1):                  # repeat 0 warms up, not recorded
        sink: dict = cells if rep else defaultdict(list)
        for length in contexts:
            order = names[rep % len(names):] + names[:rep % len(names)]
            for n in order:
                measure_drafter(drafters[n], clocks[n], ids, length, ks, feeds, sink, n)
            if target is not None:
                measure_target(target, ids, length, args.target_steps, sink)

    def cell(key) -> str:
        return f"{min(cells[key]):.2f}" if cells.get(key) else "-"

    print(f"# Drafter step cost: {', '.join(names)}")
    print(f"- CPU: {cpu_model()} ({os.cpu_count()} logical CPUs); drafters on {args.threads} ONNX Runtime thread(s)"
          + (f", target {args.target} on {args.target_threads} torch thread(s)" if target is not None else "")
          + f"; {args.repeats} repeats, configurations interleaved; cells: min over repeats, ms")
    print("- draft k: ms per drafted token of a k-token greedy block (ORT: the part inside ONNX Runtime's run); "
          "feed n: ms per token to feed n new tokens (catch-up); target: the target's plain step")
    print()
    head = (["context", "drafter"] + [f"draft k={k} (ORT)" for k in ks] + [f"feed n={n}" for n in feeds]
            + ["target step", f"draft k={ks[-1]} / target"])
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for length in contexts:
        for n in names:
            row = [str(length), n]
            row += [f"{cell((n, length, 'draft', k))} ({cell((n, length, 'draft_ort', k))})" for k in ks]
            row += [cell((n, length, "feed", f)) for f in feeds]
            t = cells.get(("target", length))
            d = cells.get((n, length, "draft", ks[-1]))
            row += [cell(("target", length)), f"{min(d) / min(t) * 100:.1f} %" if t and d else "-"]
            print("| " + " | ".join(row) + " |")
    if args.profile:
        for n, d in zip(names, dirs):
            for length in contexts:
                prof = op_profile(Path(drafters[n].onnx_path), length)
                whole = prof.pop("(whole run)")
                top = sorted(prof.items(), key=lambda kv: -kv[1])[:8]
                print(f"\n{n}, context {length}: one drafted token {whole:.0f} us in ORT's profiler; by operator: "
                      + ", ".join(f"{op} {us:.0f}" for op, us in top))
    if args.json:
        Path(args.json).write_text(json.dumps({"|".join(map(str, k)): v for k, v in cells.items()}, indent=1))
    return 0


def _shared(path: Path) -> bool:
    meta = path / "drafter.json"
    return meta.exists() and json.loads(meta.read_text()).get("kv_cache") == "shared"


if __name__ == "__main__":
    raise SystemExit(main())
