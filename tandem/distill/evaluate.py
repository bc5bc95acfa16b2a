"""Offline evaluation of a drafter against a target.

* ``simulate_tau``: greedy speculative decoding simulated exactly from the target's greedy
  continuation (``greedy_ids``) of each prompt: in each round the drafter drafts k tokens greedily
  from the context so far; the accepted count is the length of the prefix that equals the target's
  continuation; the round emits accepted + 1 tokens (recovered or bonus token) for one target
  forward. tau = tokens / rounds (mean acceptance length, bonus included), overall and per category.
  Because greedy verification is deterministic, this equals what the services would do, given the
  same target continuation.
* ``TorchDrafter`` (HF dir) and ``OrtDrafter`` (model.onnx in the standard decoder layout) share one
  small interface: ``reset()``, ``feed(ids) -> last logits over the draft vocabulary``, ``crop(n)``,
  ``length``, ``to_target(idx)``.
* ``step_costs``: one drafter step (1 token, KV cache, ONNX Runtime CPU, given threads) against one
  target step (torch, KV cache, 1 token), measured in the same process, as a ratio.
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np


class TorchDrafter:
    def __init__(self, model, draft_vocab: np.ndarray | None):
        import torch

        self.torch = torch
        self.model = model.eval()
        w = model.lm_head.weight.detach()
        self.ids = None if draft_vocab is None else np.asarray(draft_vocab, dtype=np.int64)
        self.head = w if self.ids is None else w[torch.as_tensor(self.ids)]
        self.reset()

    def reset(self):
        from transformers import DynamicCache

        self.cache = DynamicCache()
        self.length = 0

    def feed(self, ids: list[int]) -> np.ndarray:
        torch = self.torch
        with torch.no_grad():
            out = self.model.model(input_ids=torch.tensor([ids], dtype=torch.long), past_key_values=self.cache,
                                   use_cache=True)
            self.cache = out.past_key_values
            self.length += len(ids)
            return (out.last_hidden_state[0, -1] @ self.head.t()).numpy()

    def crop(self, n: int) -> None:
        if n < self.length:
            self.cache.crop(n - self.length)  # transformers 5: a negative count of tokens to remove
            self.length = n

    def to_target(self, idx: int) -> int:
        return int(idx) if self.ids is None else int(self.ids[idx])


class OrtDrafter:
    """An ONNX drafter in the standard decoder layout (input_ids, attention_mask, position_ids,
    past_key_values.{i}.key/value -> logits, present.{i}.key/value), with drafter.json beside it."""

    def __init__(self, onnx_path: str | os.PathLike, threads: int = 1):
        import onnxruntime as ort

        onnx_path = Path(onnx_path)
        d = onnx_path.parent
        meta = json.loads((d / "drafter.json").read_text()) if (d / "drafter.json").exists() else {}
        dv = meta.get("draft_vocab")
        self.ids = np.load(d / dv).astype(np.int64) if dv else None
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i for i in self.sess.get_inputs()}
        self.past_names = sorted([n for n in self.inputs if n.startswith("past_key_values")],
                                 key=lambda n: (int(n.split(".")[1]), n.split(".")[2]))
        self.out_names = [o.name for o in self.sess.get_outputs()]
        self.present_names = [n.replace("past_key_values", "present") for n in self.past_names]
        self.dtype = np.float16 if "float16" in self.inputs[self.past_names[0]].type else np.float32
        shp = self.inputs[self.past_names[0]].shape
        self.kv_heads, self.head_dim = int(shp[1]), int(shp[3])
        self.reset()

    def reset(self):
        self.past = [np.zeros((1, self.kv_heads, 0, self.head_dim), dtype=self.dtype) for _ in self.past_names]
        self.length = 0

    def feed(self, ids: list[int]) -> np.ndarray:
        q = len(ids)
        feeds = {"input_ids": np.array([ids], dtype=np.int64)}
        if "attention_mask" in self.inputs:
            feeds["attention_mask"] = np.ones((1, self.length + q), dtype=np.int64)
        if "position_ids" in self.inputs:
            feeds["position_ids"] = np.arange(self.length, self.length + q, dtype=np.int64)[None]
        for n, v in zip(self.past_names, self.past):
            feeds[n] = v
        outs = dict(zip(self.out_names, self.sess.run(None, feeds)))
        self.past = [outs[n] for n in self.present_names]
        self.length += q
        return outs["logits"][0, -1].astype(np.float32)

    def crop(self, n: int) -> None:
        if n < self.length:
            self.past = [p[:, :, :n] for p in self.past]
            self.length = n

    def to_target(self, idx: int) -> int:
        return int(idx) if self.ids is None else int(self.ids[idx])


class ServedDrafter:
    """The drafter service's own domain object (``drafter_service.onnx_drafter.OnnxDrafter``, prompt
    lookup included when ``lookup_max_ngram`` > 0), driven exactly as the gateway drives it: one
    proposal of k greedy tokens per round for the whole context so far."""

    def __init__(self, onnx_path: str | os.PathLike, threads: int = 1, lookup_max_ngram: int = 4,
                 lookup_min_ngram: int = 1, min_confidence: float = 0.0, lookup_trust_ngram: int = 1,
                 lookup_check_confidence: float = 0.5):
        from drafter_service.onnx_drafter import OnnxDrafter

        self.impl = OnnxDrafter(onnx_path, threads=threads, lookup_max_ngram=lookup_max_ngram,
                                lookup_min_ngram=lookup_min_ngram, lookup_trust_ngram=lookup_trust_ngram,
                                lookup_check_confidence=lookup_check_confidence)
        self.n = 0
        self.min_confidence = min_confidence

    def reset(self):
        self.impl.end_session(f"eval-{self.n}")
        self.n += 1

    def draft(self, context: list[int], k: int) -> list[int]:
        from tandem.types import SamplingParams

        prop = self.impl.propose(f"eval-{self.n}", 0, context, k, SamplingParams(), self.min_confidence)
        return [t.token_id for t in prop.tokens]


def load_refs(path: str | os.PathLike) -> list[dict]:
    return [json.loads(line) for line in open(path) if line.strip()]


def simulate_tau(drafter, refs: list[dict], k: int = 4, max_new: int = 128, progress: bool = True) -> dict:
    """Mean acceptance length of greedy speculative decoding (k draft tokens a round)."""
    from tqdm import tqdm

    per_cat = collections.defaultdict(lambda: [0, 0, 0])  # tokens, rounds, accepted
    pos_accept = np.zeros(k)
    proposed_total = 0
    t0 = time.perf_counter()
    for ref in tqdm(refs, desc="simulate", disable=not progress):
        prompt = list(ref["prompt_ids"])
        gen = list(ref["greedy_ids"])[:max_new]
        n = len(gen)
        ctx = prompt + gen
        P = len(prompt)
        drafter.reset()
        pos = rounds = acc_total = 0
        while pos < n:
            if hasattr(drafter, "draft"):
                draft = drafter.draft(ctx[:P + pos], k)
            else:
                logits = drafter.feed(ctx[drafter.length:P + pos])
                draft = []
                for j in range(k):
                    draft.append(drafter.to_target(int(np.argmax(logits))))
                    if j < k - 1:
                        logits = drafter.feed([draft[-1]])
            proposed_total += len(draft)
            a = 0
            while a < len(draft) and pos + a < n and draft[a] == gen[pos + a]:
                pos_accept[a] += 1
                a += 1
            rounds += 1
            acc_total += a
            if hasattr(drafter, "crop"):
                drafter.crop(P + pos + min(a, len(draft) - 1))
            pos += min(a + 1, n - pos)
        c = per_cat[ref.get("category", "all")]
        c[0] += n
        c[1] += rounds
        c[2] += acc_total
    tot = [sum(v[i] for v in per_cat.values()) for i in range(3)]
    return {
        "k": k, "prompts": len(refs), "tokens": tot[0], "rounds": tot[1],
        "tau": tot[0] / max(tot[1], 1),
        "acceptance_rate": tot[2] / max(proposed_total, 1),
        "mean_proposed": round(proposed_total / max(tot[1], 1), 3),
        "per_position_acceptance": (pos_accept / max(tot[1], 1)).round(4).tolist(),
        "per_category": {c: {"tau": round(v[0] / max(v[1], 1), 3), "tokens": v[0], "rounds": v[1]}
                         for c, v in sorted(per_cat.items())},
        "seconds": round(time.perf_counter() - t0, 1),
    }


def step_costs(target, onnx_path: str | os.PathLike, context: int = 256, ort_threads: int = 1,
               torch_threads: int | None = None, repeats: int = 30, seed: int = 0) -> dict:
    """Median ms of one 1-token step with a KV cache of ``context`` tokens: drafter (ONNX Runtime CPU)
    and target (torch), in this process; ratio = drafter / target."""
    import torch

    if torch_threads:
        torch.set_num_threads(torch_threads)
    rng = np.random.default_rng(seed)
    ids = rng.integers(100, 20000, size=context + 1).tolist()
    d = OrtDrafter(onnx_path, threads=ort_threads)
    d.feed(ids[:context])
    dts = []
    for _ in range(repeats * 5):
        t = time.perf_counter()
        d.feed([ids[context]])
        dts.append((time.perf_counter() - t) * 1000)
        d.crop(context)
    tts = []
    with torch.no_grad():
        out = target(input_ids=torch.tensor([ids[:context]]), use_cache=True)
        cache = out.past_key_values
        for _ in range(repeats):
            t = time.perf_counter()
            target(input_ids=torch.tensor([[ids[context]]]), past_key_values=cache, use_cache=True)
            tts.append((time.perf_counter() - t) * 1000)
            cache.crop(-1)
    dm, tm = statistics.median(dts[5:]), statistics.median(tts[3:])
    return {"context": context, "drafter_ms": round(dm, 3), "target_ms": round(tm, 2), "ratio": round(dm / tm, 4),
            "ort_threads": ort_threads, "torch_threads": torch.get_num_threads()}


def _heldout_prompts(tokenizer, per_category: int) -> tuple[list[dict], list[list[int]]]:
    from . import data

    by = collections.defaultdict(list)
    for q in data.spec_bench_questions("heldout"):
        by[q["category"]].append(q)
    sel = [q for c in sorted(by) for q in by[c][:per_category]]
    return sel, [data.chat_prompt_ids(tokenizer, q["turns"][0]) for q in sel]


def make_refs_served(target: str, out_path: str | os.PathLike, per_category: int = 24, max_new: int = 128,
                     slots: int = 16) -> int:
    """``make_refs`` through the verifier's decoder (``served_answers``): the greedy continuations the served
    target decodes, many prompts a forward."""
    from verifier_service import torch_thread

    from .served_answers import generate_answers, served_model

    model = served_model(target)
    sel, prompts = _heldout_prompts(model.tokenizer, per_category)
    rows = [{"prompt_ids": p, "source": str(i)} for i, p in enumerate(prompts)]
    got = {}
    torch_thread.run(generate_answers, model.decoder, rows, max_new_tokens=max_new, topk=1, slots=slots,
                     eos_ids=model.info.eos_token_ids, on_answer=lambda r: got.__setitem__(int(r["source"]), r))
    with open(out_path, "w") as f:
        for i, q in enumerate(sel):
            if i not in got:                    # longer than the target's context
                continue
            f.write(json.dumps({"question_id": q["question_id"], "category": q["category"], "prompt_ids": prompts[i],
                                "greedy_ids": got[i]["tokens"][got[i]["start"]:].tolist()}) + "\n")
    return len(got)


def make_refs(target, tokenizer, out_path: str | os.PathLike, per_category: int = 24, max_new: int = 128,
              batch_size: int = 8) -> int:
    """The target's greedy continuations of held-out Spec-Bench prompts (question_id % 4 != 0; the
    first ``per_category`` of each category in file order; first turn, chat template), as JSONL with
    question_id, category, prompt_ids, greedy_ids. Batched with left padding, written as it goes."""
    from . import data

    sel, prompts = _heldout_prompts(tokenizer, per_category)
    eos = (tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ()
    order = sorted(range(len(sel)), key=lambda i: len(prompts[i]))
    with open(out_path, "w") as f:
        for b in range(0, len(order), batch_size):
            idx = order[b:b + batch_size]
            new = data.generate(target, [prompts[i] for i in idx], max_new, greedy=True, batch_size=batch_size,
                                eos_ids=eos, pad_id=tokenizer.pad_token_id or 0, progress=False)
            for i, n in zip(idx, new):
                f.write(json.dumps({"question_id": sel[i]["question_id"], "category": sel[i]["category"],
                                    "prompt_ids": prompts[i], "greedy_ids": n}) + "\n")
            f.flush()
    return len(sel)


def main(argv: list[str] | None = None) -> int:
    """python -m tandem.distill.evaluate {refs,run} ...: held-out references, tau and step cost."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m tandem.distill.evaluate", description=main.__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("refs", help="target greedy continuations of held-out Spec-Bench prompts")
    r.add_argument("--target", default="default")
    r.add_argument("--out", required=True)
    r.add_argument("--per-category", type=int, default=24)
    r.add_argument("--max-new", type=int, default=128)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--device", default="cpu", help="where the target writes the references: cpu, cuda, auto "
                   "(default: cpu)")
    r.add_argument("--engine", choices=("transformers", "served"), default="transformers",
                   help="'served': the verifier's decoder as served (its --activations from TANDEM_ACTIVATIONS), "
                   "many prompts a forward (default: transformers)")
    e = sub.add_parser("run", help="tau (torch HF dir and/or ONNX) and the drafter/target step-cost ratio")
    e.add_argument("--target", default="default")
    e.add_argument("--refs", required=True)
    e.add_argument("--hf", default=None, help="drafter HF directory (simulated in torch)")
    e.add_argument("--onnx", action="append", default=[], help="drafter model.onnx (simulated in ONNX Runtime); repeatable")
    e.add_argument("--served", action="store_true",
                   help="also simulate each --onnx drafter as the drafter service runs it (OnnxDrafter with "
                        "prompt lookup --lookup-ngram .. --lookup-min-ngram in front of the model)")
    e.add_argument("--lookup-ngram", type=int, default=4, help="with --served (default: %(default)s)")
    e.add_argument("--lookup-min-ngram", type=int, default=1, help="with --served (default: %(default)s)")
    e.add_argument("--lookup-trust-ngram", type=int, action="append", default=None,
                   help="with --served: lookup matches shorter than this are checked against the model (1 = never); "
                        "repeatable, one simulation each (default: 1, as the drafter service)")
    e.add_argument("--lookup-check-confidence", type=float, default=0.5, help="with --served (default: %(default)s)")
    e.add_argument("--min-confidence", type=float, action="append", default=None,
                   help="with --served: the drafter's confidence stop (adaptive draft length); repeatable, one "
                        "simulation each (default: 0 = always k tokens)")
    e.add_argument("--k", type=int, default=4)
    e.add_argument("--limit", type=int, default=0, help="use only the first N references (0 = all)")
    e.add_argument("--per-category", type=int, default=0,
                   help="use only the first N references of each category (0 = all)")
    e.add_argument("--no-cost", action="store_true", help="skip the step-cost measurement")
    e.add_argument("--threads", type=int, default=1, help="ONNX Runtime and torch threads")
    e.add_argument("--out", default=None, help="write the results (JSON) here, e.g. <drafter dir>/eval.json")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from ..models import load_causal_lm, load_causal_lm_or_explain

    torch.set_num_threads(args.threads)
    if args.cmd == "refs" and args.engine == "served":
        n = make_refs_served(args.target, args.out, args.per_category, args.max_new)
        print(f"wrote {n} references to {args.out}", file=sys.stderr)
        return 0
    if args.cmd == "refs":
        loaded = load_causal_lm_or_explain(args.target, lambda m: print(m, file=sys.stderr), args.device)
        if loaded is None:
            return 2
        target, tok, _ = loaded
        n = make_refs(target, tok, args.out, args.per_category, args.max_new)
        print(f"wrote {n} references to {args.out}", file=sys.stderr)
        return 0
    refs = load_refs(args.refs)
    if args.per_category:
        seen: dict = collections.Counter()
        keep = []
        for r in sorted(refs, key=lambda r: r["question_id"]):
            if seen[r["category"]] < args.per_category:
                seen[r["category"]] += 1
                keep.append(r)
        refs = keep
    if args.limit:
        refs = refs[:args.limit]
    res: dict = {"tau": {}, "cost": {}, "commands": ["python -m tandem.distill.evaluate " + " ".join(sys.argv[1:])],
                 "refs": str(args.refs)}
    if args.hf:
        from transformers import AutoModelForCausalLM

        from .student import load_draft_vocab

        m = AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32)
        res["tau"][f"torch fp32 ({Path(args.hf).name})"] = simulate_tau(TorchDrafter(m, load_draft_vocab(args.hf)),
                                                                     refs, k=args.k)
    for path in args.onnx:
        name = f"ONNX {Path(path).parent.name}/{Path(path).name}"
        res["tau"][name] = simulate_tau(OrtDrafter(path, threads=args.threads), refs, k=args.k)
        for conf, trust in ([(c, t) for c in args.min_confidence or [0.0] for t in args.lookup_trust_ngram or [1]]
                            if args.served else []):
            served = ServedDrafter(path, threads=args.threads, lookup_max_ngram=args.lookup_ngram,
                                   lookup_min_ngram=args.lookup_min_ngram, min_confidence=conf,
                                   lookup_trust_ngram=trust, lookup_check_confidence=args.lookup_check_confidence)
            stop = f", confidence stop {conf:g}" if conf else ""
            check = (f", matches under {trust} tokens checked at {args.lookup_check_confidence:g}"
                     if trust > args.lookup_min_ngram else "")
            res["tau"][f"{name} + prompt lookup {args.lookup_ngram}..{args.lookup_min_ngram}{check}{stop} (as served)"] \
                = simulate_tau(served, refs, k=args.k)
    if args.onnx and not args.no_cost:
        target, _, _ = load_causal_lm(args.target)
        for path in args.onnx:
            res["cost"][f"{Path(path).parent.name}/{Path(path).name}"] = step_costs(
                target, path, ort_threads=args.threads, torch_threads=args.threads)
    for name, t in res["tau"].items():
        print(f"{name}: tau {t['tau']:.3f} (drafts/round {t['mean_proposed']:.2f}) " + " ".join(f"{c}={v['tau']:.2f}" for c, v in t["per_category"].items()),
              file=sys.stderr)
    for name, c in res["cost"].items():
        print(f"{name}: drafter {c['drafter_ms']} ms / target {c['target_ms']} ms = {c['ratio']:.3f}", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
