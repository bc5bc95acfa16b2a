"""`tandem distill`: train a small drafter for a target and (optionally) export it to ONNX.

Pipeline (every stage is resumable: its outputs live in the work directory and are reused):
  1. data: the records to learn from. For the default target, the shared corpus of its own sampled
     answers to the training split of Spec-Bench (question_id % 4 == 0); for any target, ``--data``
     JSONL files of token ids and/or ``--generate N`` answers sampled from the target itself on the
     training-split prompts; optionally ``--offline-text TOKENS`` of Python standard-library source.
  2. teacher pass: the target's top-k next-token log-probs over all of it (teacher forcing).
  3. student: a small Llama with the target's tokenizer, low-rank embeddings, a draft vocabulary.
  4. training (AdamW, cosine, seeds, checkpoints; ``--resume``), progress bar with loss and held-out
     greedy agreement; the HF drafter directory goes to ``--out`` with a model card (README.md).
  5. ``--export``: ONNX drafter (model.onnx + drafter.json) via ``tandem.export.export_drafter``.

More prompts and the target's greedy answers to them come from ``tandem.distill.prompts`` and
``tandem.distill.answers`` (teacher files in one pass); ``--teacher-shards`` (repeatable) trains on them,
``--init-from`` continues an earlier run's weights with a fresh optimizer.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

from tandem.export_quantize import QUANTIZE_MODES


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.description = ("Train a small drafter (same tokenizer) for a target by distillation from the target's "
                          "own outputs, write it as a Hugging Face directory with a model card, and optionally "
                          "export it to ONNX for the drafter service.")
    parser.epilog = ("More data for a target: `python -m tandem.distill.prompts --out P.jsonl` builds varied "
                     "training prompts offline (written by the target, from package docs and the standard "
                     "library), `python -m tandem.distill.answers --prompts P.jsonl --out-dir D` has the target "
                     "answer them greedily and keeps its top-k on the way; then train with --teacher-shards "
                     "'D/answers_*.pt' (repeatable) and, to continue an earlier drafter, --init-from.")
    parser.add_argument("--target", default="default",
                        help="target model: 'default' (SmolLM2-135M-Instruct), a .gguf file or a Hugging Face "
                             "model directory (default: %(default)s)")
    parser.add_argument("--out", required=True, help="output directory for the drafter (HF weights, tokenizer, "
                                                     "draft_vocab.npy, README.md model card; ONNX with --export)")
    parser.add_argument("--work-dir", default=None,
                        help="where teacher data, generated samples and checkpoints go "
                             "(default: .distill_work/<name of --out>)")
    g = parser.add_argument_group("data")
    g.add_argument("--data", action="append", default=None, metavar="JSONL",
                   help="training records, one JSON object a line: prompt_ids (optional) and output_ids (token "
                        "ids of the target's vocabulary); repeatable. Default for --target default: the shared "
                        "corpus of the target's own answers (training split of Spec-Bench) if present. Rows "
                        "whose question_id is a held-out Spec-Bench question (id %% 4 != 0) are refused")
    g.add_argument("--no-default-data", action="store_true", help="do not add the shared corpus automatically")
    g.add_argument("--generate", type=int, default=0, metavar="N",
                   help="also sample N answers from the target itself on training-split Spec-Bench prompts "
                        "(or --prompts) and learn from them (default: %(default)s; slow on CPU for real models)")
    g.add_argument("--gen-tokens", type=int, default=128, help="max new tokens per generated answer (default: %(default)s)")
    g.add_argument("--gen-greedy", action="store_true", help="generate greedily instead of sampling (T=0.8, top-p 0.95)")
    g.add_argument("--prompts", default=None, metavar="JSONL",
                   help="prompts for --generate: JSONL with 'text' (templated with the chat template) or "
                        "'prompt_ids'; default: first turns of the training split of Spec-Bench")
    g.add_argument("--offline-text", type=int, default=0, metavar="TOKENS",
                   help="add this many tokens of Python standard-library source as plain text (default: 0)")
    g.add_argument("--teacher-shards", action="append", default=None, metavar="GLOB",
                   help="train on these existing teacher-pass files (from an earlier run's work directory, or "
                        "answers_NNN.pt from python -m tandem.distill.answers) instead of collecting data and "
                        "running the teacher pass; repeatable")
    g.add_argument("--topk", type=int, default=8, help="target top-k kept per position for the KL term (default: 8)")
    m = parser.add_argument_group("student")
    m.add_argument("--hidden", type=int, default=384, help="hidden size (default: %(default)s)")
    m.add_argument("--layers", type=int, default=4, help="decoder layers (default: %(default)s)")
    m.add_argument("--heads", type=int, default=6, help="attention heads (default: %(default)s)")
    m.add_argument("--kv-heads", type=int, default=2, help="key/value heads (default: %(default)s)")
    m.add_argument("--intermediate", type=int, default=1024, help="MLP size (default: %(default)s)")
    m.add_argument("--from-target-layers", type=int, default=0, metavar="L",
                   help="build the drafter from the target's own first L decoder layers (its width, heads and "
                        "embeddings; --hidden/--layers/--heads/--kv-heads/--intermediate are then ignored) instead "
                        "of a fresh small model; 0 = fresh (default: %(default)s)")
    m.add_argument("--frozen-layers", type=int, default=0, metavar="F",
                   help="with --from-target-layers: keep the bottom F copied layers (and the embedding) frozen and "
                        "train only the layers above them, the final norm and the head (default: %(default)s)")
    m.add_argument("--draft-vocab", type=int, default=16384,
                   help="size of the reduced draft vocabulary (most frequent target tokens in the data plus "
                        "special tokens); 0 = the full target vocabulary (default: %(default)s)")
    t = parser.add_argument_group("training")
    t.add_argument("--steps", type=int, default=2000, help="optimizer steps; one step = one prompt group (default: %(default)s)")
    t.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default: %(default)s)")
    t.add_argument("--warmup", type=int, default=100, help="warm-up steps (default: %(default)s)")
    t.add_argument("--answers-per-step", type=int, default=6,
                   help="answers to one prompt trained in one step (the prompt is encoded once for them) "
                        "(default: %(default)s)")
    t.add_argument("--max-prompt", type=int, default=1024, help="prompt tokens kept (the last ones) (default: %(default)s)")
    t.add_argument("--prompt-fraction", type=float, default=0.1,
                   help="fraction of prompt positions trained besides the answers (default: %(default)s)")
    t.add_argument("--heldout-fraction", type=float, default=0.05,
                   help="fraction of prompts kept out of training for the progress metric (default: %(default)s)")
    t.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    t.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    t.add_argument("--device", default=os.environ.get("TANDEM_DEVICE", "auto"),
                   help="where the target (generation, teacher pass) and the student's training run: auto (a CUDA "
                        "GPU when torch sees one, else the CPU), cpu, cuda, cuda:1 ... The ONNX export always runs "
                        "on the CPU [env TANDEM_DEVICE; default auto]")
    t.add_argument("--ckpt-every", type=int, default=50, help="checkpoint every N steps (default: %(default)s)")
    t.add_argument("--eval-every", type=int, default=50, help="held-out agreement every N steps (default: %(default)s)")
    t.add_argument("--final", choices=["best", "last"], default="best",
                   help="weights written to --out: the best held-out evaluation or the last step (default: %(default)s)")
    t.add_argument("--time-budget", type=float, default=0, metavar="MINUTES",
                   help="stop this run after MINUTES of training, with the cosine decay ending then "
                        "(whichever of --steps and the budget comes first; 0 = off)")
    t.add_argument("--resume", action="store_true", help="continue from the checkpoint in the work directory")
    t.add_argument("--init-from", default=None, metavar="CKPT",
                   help="start from the weights of an earlier run (its ckpt.pt or best.pt; the student options "
                        "must match it, the draft vocabulary is taken from its directory) with a fresh optimizer "
                        "and schedule: fine-tune a drafter on new data")
    t.add_argument("--no-progress", action="store_true", help="no progress bars")
    e = parser.add_argument_group("export")
    e.add_argument("--export", action="store_true", help="export the trained drafter to ONNX in --out (needs tandem.export)")
    e.add_argument("--quantize", default=None, choices=list(QUANTIZE_MODES),
                   help="quantisation for --export (int4: block-wise 4-bit weights, see tandem export-drafter)")
    return parser


def _target_name(spec: str) -> str:
    return "SmolLM2-135M-Instruct" if spec == "default" else Path(spec).name


def collect_records(args, model, tokenizer, work: Path, log) -> tuple[list, list[dict]]:
    """All training records and a manifest entry per source."""
    from . import data

    records: list = []
    manifest: list[dict] = []
    paths = list(args.data or [])
    if not paths and args.target == "default" and not args.no_default_data and data.DEFAULT_CORPUS.exists():
        paths.append(str(data.DEFAULT_CORPUS))
    for p in paths:
        recs = data.load_jsonl_records(p)
        records += recs
        manifest.append({"source": str(p), "kind": "jsonl", "records": len(recs),
                         "answer_tokens": sum(len(r.output_ids) for r in recs),
                         "question_ids": sorted({r.question_id for r in recs if r.question_id is not None})})
        log(f"data: {len(recs)} records from {p}")
    if args.generate:
        gen_path = work / "generated.jsonl"
        have = sum(1 for line in open(gen_path) if line.strip()) if gen_path.exists() else -1
        if have == args.generate:
            log(f"data: reusing {have} generated answers in {gen_path}")
        else:
            prompts = _generation_prompts(args, tokenizer)
            chosen = [prompts[i % len(prompts)] for i in range(args.generate)]
            eos = tokenizer.eos_token_id
            outs = data.generate(model, [c["prompt_ids"] for c in chosen], args.gen_tokens, greedy=args.gen_greedy,
                                 seed=args.seed, batch_size=8, eos_ids=(eos,) if eos is not None else (),
                                 pad_id=tokenizer.pad_token_id or 0, progress=not args.no_progress)
            tmp = gen_path.with_suffix(".tmp")
            with open(tmp, "w") as f:
                for c, o, i in zip(chosen, outs, range(len(chosen))):
                    f.write(json.dumps({**{k: v for k, v in c.items() if k != "text"}, "sample": i // len(prompts),
                                        "output_ids": o}) + "\n")
            os.replace(tmp, gen_path)
        recs = data.load_jsonl_records(gen_path, source="generated")
        records += recs
        manifest.append({"source": str(gen_path), "kind": "generated by the target",
                         "greedy": bool(args.gen_greedy), "records": len(recs),
                         "answer_tokens": sum(len(r.output_ids) for r in recs)})
        log(f"data: {len(recs)} answers generated by the target")
    if args.offline_text:
        recs = data.offline_text_records(tokenizer, args.offline_text, seed=args.seed)
        records += recs
        manifest.append({"source": "python stdlib sources (sysconfig stdlib path)", "kind": "plain text",
                         "records": len(recs), "tokens": sum(len(r.output_ids) for r in recs)})
        log(f"data: {len(recs)} chunks of standard-library text")
    return records, manifest


def _generation_prompts(args, tokenizer) -> list[dict]:
    from . import data

    if args.prompts:
        out = []
        for line in open(args.prompts):
            if line.strip():
                row = json.loads(line)
                ids = row.get("prompt_ids") or data.chat_prompt_ids(tokenizer, row["text"])
                out.append({"prompt_ids": list(ids), "question_id": row.get("question_id"),
                            "category": row.get("category", "")})
        return out
    return [{"prompt_ids": data.chat_prompt_ids(tokenizer, q["turns"][0]), "question_id": q["question_id"],
             "category": q["category"]} for q in data.spec_bench_questions("train")]


def run(args) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import numpy as np
    import torch

    from ..models import load_causal_lm_or_explain, model_device
    from . import card, data, student, train

    t_start = time.time()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    work = Path(args.work_dir) if args.work_dir else Path(".distill_work") / out.name
    work.mkdir(parents=True, exist_ok=True)
    (work / "teacher").mkdir(exist_ok=True)

    def log(msg: str) -> None:
        print(f"[distill] {msg}", file=sys.stderr, flush=True)

    loaded = load_causal_lm_or_explain(args.target, log, args.device)
    if loaded is None:
        return 2
    target, tokenizer, loc = loaded
    device = str(model_device(target))
    shard_paths = []
    if args.teacher_shards:
        import glob

        for pattern in args.teacher_shards:
            found = [Path(p) for p in sorted(glob.glob(pattern))]
            if not found:
                log(f"no files match --teacher-shards {pattern}")
                return 2
            shard_paths += found
        records, manifest = [], data.shard_manifest(shard_paths)
        bad = [m["source"] for m in manifest if not m["all_training_split"]]
        if bad:
            log(f"refusing teacher files with held-out Spec-Bench questions (id % 4 != 0): {bad}")
            return 2
    else:
        records, manifest = collect_records(args, target, tokenizer, work, log)
        if not records:
            log("no training data: give --data, --generate N or --offline-text TOKENS")
            return 2

    # ---- teacher pass, in shards (each reused when present)
    by_source = collections.defaultdict(list)
    for r in records:
        by_source[r.source].append(r)
    for src, recs in by_source.items():
        def key(r):
            return (-1 if r.question_id is None else int(r.question_id), tuple(r.prompt_ids[:16]))

        qids = sorted({key(r) for r in recs})
        n_shards = 4 if len(recs) >= 400 else 1
        stem = "corpus" if src == data.DEFAULT_CORPUS.name else "".join(c if c.isalnum() else "_" for c in src)[:40]
        for k in range(n_shards):
            path = work / "teacher" / (f"{stem}_{k}.pt" if n_shards > 1 else f"{stem}.pt")
            if path.exists():
                log(f"teacher: reusing {path}")
            else:
                key_of = {q: i for i, q in enumerate(qids)}
                part = [r for r in recs if key_of[key(r)] % n_shards == k]
                info = data.teacher_pass(target, part, path, topk=args.topk, progress=not args.no_progress,
                                         desc=f"teacher {path.stem}")
                log(f"teacher: {path} {info}")
            shard_paths.append(path)
    shards = data.load_shards(shard_paths)

    # ---- split for the progress metric (by prompt), draft vocabulary, student
    import hashlib

    def is_val(s) -> bool:  # stable per prompt, whatever other data is present
        key = f"{s.get('question_id')}|".encode() + s["tokens"][:s["start"]].tobytes()
        return int(hashlib.sha1(key).hexdigest()[:8], 16) % 10000 < args.heldout_fraction * 10000

    va_sh = [s for s in shards if is_val(s)]
    tr_sh = [s for s in shards if not is_val(s)] or va_sh
    va_sh = va_sh or tr_sh[:1]
    counts = collections.Counter()
    for s in tr_sh:
        counts.update(s["tokens"].tolist())
        counts.update(s["top_ids"][:, 0].tolist())
    vocab = target.config.vocab_size
    draft_vocab = student.choose_draft_vocab(counts, args.draft_vocab, vocab, student.special_ids(tokenizer))
    ckpt_dv = work / "draft_vocab.npy"
    if args.init_from and not (args.resume and (work / train.CHECKPOINT_FILE).exists()):
        init_dv = Path(args.init_from).parent / "draft_vocab.npy"
        if not init_dv.exists():
            log(f"--init-from {args.init_from}: no draft_vocab.npy beside it")
            return 2
        draft_vocab = np.load(init_dv).astype(np.int64)
        np.save(ckpt_dv, draft_vocab)
        log(f"init: draft vocabulary from {init_dv}")
    elif args.resume and ckpt_dv.exists():
        draft_vocab = np.load(ckpt_dv).astype(np.int64)  # the vocabulary the checkpoint was trained with
        log(f"resume: draft vocabulary from {ckpt_dv}")
    else:
        np.save(ckpt_dv, draft_vocab)
    spec = student.StudentSpec(hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
                               intermediate=args.intermediate, draft_vocab=len(draft_vocab))
    if args.from_target_layers:
        tc = target.config
        spec = student.StudentSpec(hidden=tc.hidden_size, layers=args.from_target_layers,
                                   heads=tc.num_attention_heads, kv_heads=tc.num_key_value_heads,
                                   intermediate=tc.intermediate_size, draft_vocab=len(draft_vocab))
        model = student.build_student_from_target(target, args.from_target_layers, args.frozen_layers, draft_vocab)
    else:
        model = student.build_student(target, tokenizer, spec, draft_vocab, seed=args.seed)
    n_params = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("lm_head")) \
        + len(draft_vocab) * spec.hidden
    n_trained = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("lm_head") and p.requires_grad) \
        + len(draft_vocab) * spec.hidden
    log(f"student: {spec.to_dict()} draft vocab {len(draft_vocab)} -> {n_params / 1e6:.1f} M parameters "
        f"(the head counted on the draft rows), {n_trained / 1e6:.1f} M trained"
        + (f"; from the target's first {args.from_target_layers} layers, {args.frozen_layers} frozen"
           if args.from_target_layers else ""))

    cfg = train.TrainConfig(steps=args.steps, lr=args.lr, warmup=min(args.warmup, max(1, args.steps // 10)),
                            max_prompt=args.max_prompt, prompt_fraction=args.prompt_fraction, seed=args.seed,
                            ckpt_every=args.ckpt_every, eval_every=args.eval_every, threads=args.threads,
                            time_budget_s=args.time_budget * 60)
    model.to(device)
    tr_groups = train.make_groups(tr_sh, max_prompt=args.max_prompt, answers_per_group=args.answers_per_step)
    va_groups = train.make_groups(va_sh, max_prompt=args.max_prompt, answers_per_group=args.answers_per_step)
    trainer = train.Trainer(model, draft_vocab, tr_groups, va_groups, cfg, work, progress=not args.no_progress)
    if args.resume and trainer.load_checkpoint():
        trainer.best = (-1.0, 0)  # the held-out set may differ from the previous run's: track anew
        log(f"resumed at step {trainer.step}")
    elif args.init_from:
        try:
            trainer.load_weights(args.init_from)
        except (RuntimeError, KeyError, FileNotFoundError) as e:
            log(f"--init-from {args.init_from}: cannot load its weights into this student ({e})")
            return 2
        log(f"init: weights from {args.init_from}; fresh optimizer and schedule")
    elif trainer.ckpt_path.exists() and not args.resume:
        log(f"a checkpoint exists in {work}: starting over (use --resume to continue it)")
    result = trainer.fit()
    heldout = trainer.evaluate()
    if args.final == "best" and trainer.best[1] and trainer.best[1] != trainer.step:
        best = trainer.load_best()
        heldout = trainer.evaluate()
        log(f"keeping the best held-out checkpoint: step {best[1]} (agreement {heldout:.3f})")
        result["kept_step"] = best[1]
    log(f"trained {result['step']} steps in {result['train_seconds']:.0f}s; held-out greedy agreement {heldout:.3f}")

    model.to("cpu")
    student.save_student(model, tokenizer, draft_vocab, out, extra={"tandem_target": _target_name(args.target)})
    info = {
        "target": args.target, "target_name": _target_name(args.target),
        "command": "tandem distill " + " ".join(sys.argv[2:] if len(sys.argv) > 2 and sys.argv[1] == "distill" else sys.argv[1:]),
        "student": spec.to_dict(), "parameters": n_params, "trained_parameters": n_trained,
        "init": ({"from_target_layers": args.from_target_layers, "frozen_layers": args.frozen_layers}
                 if args.from_target_layers else {"fresh": True, "embeddings": "low-rank projection of the target's"}),
        "draft_vocab_size": int(len(draft_vocab)),
        "data": manifest, "split": "Spec-Bench question_id % 4 == 0 only; progress metric on "
                                   f"{len(va_groups)} held-out prompt groups of the training data",
        "train_groups": len(tr_groups), "train": {k: v for k, v in result.items() if k != "history"},
        "history": result["history"], "heldout_agreement": heldout, "train_config": cfg.__dict__,
        "teacher_shards": [str(p) for p in shard_paths], "wall_seconds": round(time.time() - t_start, 1),
        "device": device,
        "interrupted": result["interrupted"],
    }
    (out / "distill_info.json").write_text(json.dumps(info, indent=1, default=str))
    if args.export:
        onnx_info = export(out, quantize=args.quantize, log=log)
        info["export"] = onnx_info
        (out / "distill_info.json").write_text(json.dumps(info, indent=1, default=str))
    card.write_card(out, info)
    log(f"drafter written to {out}")
    return 130 if result["interrupted"] else 0


def export(hf_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None, quantize: str | None = None,
           check: bool = True, log=print) -> dict:
    """ONNX export of a distilled drafter through ``tandem.export.export_drafter``, which reads the
    reduced draft vocabulary (``draft_vocab.npy`` named in config.json) itself: the ONNX logits then
    have ``len(draft_vocab)`` columns and drafter.json names the .npy copied beside model.onnx."""
    try:
        from .. import export as export_mod
    except ImportError as e:
        log(f"export: tandem.export is not available ({e}); the HF drafter directory is written, export it later")
        return {"error": str(e)}
    rep = export_mod.export_drafter(str(hf_dir), str(out_dir or hf_dir), check=check, quantize=quantize)
    res = rep.to_dict() if hasattr(rep, "to_dict") else {"result": str(rep)}
    log(f"export: {res.get('onnx_path')} ({res.get('onnx_bytes', 0) / 1e6:.1f} MB), parity "
        f"{res.get('parity_no_past')} / {res.get('parity_with_past')}")
    return res


def main(argv: list[str] | None = None) -> int:
    parser = configure(argparse.ArgumentParser(prog="tandem distill"))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
