"""The target answers prompts greedily and its own top-k is kept on the way: teacher-pass files in one pass.

A separate teacher pass (``data.teacher_pass``) re-runs the target over text it has just written; when
the answers are generated here anyway, the logits that chose each answer token are the teacher's
prediction at that position, so keeping their top-k costs almost nothing. The prompt positions get
theirs from the prefill (the decoder's hidden states through the head, one row at a time so a long
prompt never materialises a [batch, length, vocabulary] tensor).

Output: ``answers_NNN.pt`` files in the format of ``data.teacher_pass`` (``tokens``, ``start``,
``top_ids``/``top_logp`` [len(tokens) - 1, k], ``source``, ``question_id``, ``category``), written
atomically one shard at a time, so an interrupted run resumes at the first missing shard.
``python -m tandem.distill.answers --help``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def _answer_batch(model, prompts: list[list[int]], max_new_tokens: int, topk: int, eos: set[int],
                  pad_id: int) -> list[tuple[list[int], np.ndarray, np.ndarray]]:
    """Greedy answers to a batch of prompts (left padded); per prompt (answer, top_ids, top_logp) with
    one teacher row per position of prompt + answer except the last. Runs where the model's weights are
    (CPU or GPU); the host sees one copy of the chosen tokens a step."""
    import torch

    from ..models import model_device

    device = model_device(model)
    B, W = len(prompts), max(len(p) for p in prompts)
    input_ids = torch.full((B, W), pad_id, dtype=torch.long)
    mask = torch.zeros((B, W), dtype=torch.long)
    for r, p in enumerate(prompts):
        input_ids[r, W - len(p):] = torch.tensor(p)
        mask[r, W - len(p):] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    prompt_rows: list[tuple[torch.Tensor, torch.Tensor]] = []  # per prompt: top ids, top log-probs [P, K]
    step_rows: list[tuple[torch.Tensor, torch.Tensor]] = []    # per decoding step: [B, K] each
    answers: list[list[int]] = [[] for _ in range(B)]
    with torch.no_grad():
        out = model.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=True)
        past, hidden = out.past_key_values, out.last_hidden_state  # hidden [B, W, H]
        last = []
        for r, p in enumerate(prompts):
            lp = torch.log_softmax(model.lm_head(hidden[r, W - len(p):]).float(), -1)  # [P, V]
            v, i = lp.topk(topk, -1)  # [P, K]
            prompt_rows.append((i, v))
            last.append(lp[-1])
        logits = torch.stack(last)  # [B, V] (log-probs: same argmax)
        done = [False] * B
        next_pos = position_ids[:, -1:] + 1
        for step in range(max_new_tokens):
            tok = logits.argmax(-1)  # [B]
            for r, t in enumerate(tok.tolist()):
                if not done[r]:
                    answers[r].append(t)
                    done[r] = t in eos
            if all(done) or step == max_new_tokens - 1:
                break
            mask = torch.cat([mask, mask.new_ones((B, 1))], dim=1)
            res = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos, past_key_values=past,
                        use_cache=True)
            past, next_pos = res.past_key_values, next_pos + 1
            logits = torch.log_softmax(res.logits[:, -1, :].float(), -1)  # [B, V]
            v, i = logits.topk(topk, -1)  # [B, K]: row r predicts answers[r][step + 1]
            step_rows.append((i, v))
    # [S, B, K] on the host once; a prompt keeps the steps before its answer ended
    s_ids = torch.stack([i for i, _ in step_rows]).cpu() if step_rows else None
    s_lp = torch.stack([v for _, v in step_rows]).cpu() if step_rows else None
    out_rows = []
    for r, p in enumerate(prompts):
        n_steps = len(answers[r]) - 1
        ids, lps = prompt_rows[r][0].cpu(), prompt_rows[r][1].cpu()
        if n_steps > 0:
            ids = torch.cat([ids, s_ids[:n_steps, r]])
            lps = torch.cat([lps, s_lp[:n_steps, r]])
        out_rows.append((answers[r], ids.numpy().astype(np.int32), lps.numpy().astype(np.float16)))
    return out_rows


def answer_prompts(model, prompts: list[dict], out_dir: str | os.PathLike, *, max_new_tokens: int = 128,
                   topk: int = 8, shard_size: int = 256, batch_tokens: int = 16384, max_batch: int = 64,
                   eos_ids: tuple[int, ...] = (), pad_id: int = 0, progress: bool = True) -> dict:
    """Answers ``prompts`` (dicts with ``prompt_ids`` and optional ``category``/``source``/``question_id``)
    greedily, shortest first, and writes teacher-pass shards to ``out_dir``. Existing shards are kept."""
    import torch
    from tqdm import tqdm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]["prompt_ids"]), i))
    shards = [order[s:s + shard_size] for s in range(0, len(order), shard_size)]
    eos = {int(e) for e in eos_ids}
    bar = tqdm(total=len(prompts), desc="answers", unit="prompt", disable=not progress, file=sys.stderr)
    t0, n_answer, n_prompt, written = time.perf_counter(), 0, 0, []
    for k, shard in enumerate(shards):
        path = out_dir / f"answers_{k:03d}.pt"
        written.append(str(path))
        if path.exists():
            bar.update(len(shard))
            continue
        saved, b = [], 0
        while b < len(shard):
            width = len(prompts[shard[min(len(shard) - 1, b + max_batch - 1)]]["prompt_ids"]) + max_new_tokens
            size = max(1, min(max_batch, batch_tokens // width))
            idx = shard[b:b + size]
            b += size
            batch = [list(prompts[i]["prompt_ids"]) for i in idx]
            for i, p, (ans, ids, lps) in zip(idx, batch, _answer_batch(model, batch, max_new_tokens, topk, eos,
                                                                         pad_id)):
                row = prompts[i]
                saved.append({"tokens": np.asarray(p + ans, dtype=np.int32), "start": len(p), "top_ids": ids,
                              "top_logp": lps, "source": row.get("source", "answers"),
                              "question_id": row.get("question_id"), "category": row.get("category", "")})
                n_answer += len(ans)
                n_prompt += len(p)
            bar.update(len(idx))
            bar.set_postfix(answer_tok_s=f"{n_answer / (time.perf_counter() - t0):.0f}")
        tmp = path.with_suffix(".tmp")
        torch.save(saved, tmp)
        os.replace(tmp, path)
    bar.close()
    return {"shards": written, "answer_tokens": n_answer, "prompt_tokens": n_prompt,
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv=None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    p = argparse.ArgumentParser(prog="python -m tandem.distill.answers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", required=True, help="JSONL (or .jsonl.gz): 'text' (chat-templated here) or 'prompt_ids', "
                   "optional 'category', 'source' (e.g. from python -m tandem.distill.prompts)")
    p.add_argument("--out-dir", required=True, help="where the answers_NNN.pt teacher files go")
    p.add_argument("--target", default="default", help="target model (default: default)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="answer length cap (default: 128)")
    p.add_argument("--max-prompt", type=int, default=1536, help="longer prompts are skipped (default: 1536)")
    p.add_argument("--topk", type=int, default=8, help="teacher top-k kept per position (default: 8)")
    p.add_argument("--shard-size", type=int, default=256, help="prompts per output file (default: 256)")
    p.add_argument("--batch-tokens", type=int, default=32768,
                   help="padded tokens (prompt + answer) per batch: long prompts get smaller batches (default: 32768)")
    p.add_argument("--max-batch", type=int, default=96, help="prompts per batch at most (default: 96)")
    p.add_argument("--device", default="auto", help="where the target runs: auto (a CUDA GPU when torch sees one, "
                   "else the CPU), cpu, cuda, cuda:1 ... (default: auto)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch CPU threads (default: all cores)")
    p.add_argument("--engine", choices=("transformers", "served"), default="transformers",
                   help="'transformers': padded batches in fp32 (any target, CPU or GPU); 'served': the verifier's "
                   "decoder over the GGUF file's blocks, many answers a forward (tandem.distill.served_answers; "
                   "about 10x faster on a CPU) (default: transformers)")
    p.add_argument("--samples", type=int, default=1, help="answers per prompt, --engine served: the first greedy, "
                   "the others sampled at --temperature (default: 1)")
    p.add_argument("--temperature", type=float, default=0.8, help="temperature of samples 1.. (default: 0.8)")
    p.add_argument("--slots", type=int, default=16, help="answers decoded together, --engine served (default: 16)")
    p.add_argument("--activations", default=None, help="--engine served: the verifier's --activations "
                   "(fp32 or int8; default: TANDEM_ACTIVATIONS, else fp32)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled answers (default: 0)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.engine == "served":
        return _main_served(args)

    import torch

    from ..models import load_causal_lm_or_explain
    torch.set_num_threads(args.threads)
    loaded = load_causal_lm_or_explain(args.target, lambda m: print(f"[answers] {m}", file=sys.stderr), args.device)
    if loaded is None:
        return 2
    model, tok, _ = loaded
    model.eval()
    read = _read_prompts(args.prompts, tok, args.max_prompt)
    if read is None:
        return 2
    prompts, skipped = read
    print(f"[answers] {len(prompts)} prompts ({skipped} longer than {args.max_prompt} tokens skipped)",
          file=sys.stderr)
    eos = tok.eos_token_id
    info = answer_prompts(model, prompts, args.out_dir, max_new_tokens=args.max_new_tokens, topk=args.topk,
                          shard_size=args.shard_size, batch_tokens=args.batch_tokens, max_batch=args.max_batch,
                          eos_ids=(eos,) if eos is not None else (),
                          pad_id=tok.pad_token_id or 0, progress=not args.no_progress)
    print(f"[answers] {json.dumps(info)}", file=sys.stderr)
    return 0


def _read_prompts(path: str, tokenizer, max_prompt: int) -> tuple[list[dict], int] | None:
    """The prompts of a JSONL file (chat-templated 'text' or 'prompt_ids'), those over ``max_prompt`` tokens
    counted and left out; None (after saying why) if one is a held-out Spec-Bench question."""
    from .data import chat_prompt_ids, is_training_question

    prompts, skipped = [], 0
    opener = gzip.open if path.endswith(".gz") else open
    for line in opener(path, "rt", encoding="utf-8"):
        if not line.strip():
            continue
        row = json.loads(line)
        qid = row.get("question_id")
        if qid is not None and not is_training_question(qid):
            print(f"refusing {path}: question_id {qid} is a held-out Spec-Bench question", file=sys.stderr)
            return None
        ids = row.get("prompt_ids") or chat_prompt_ids(tokenizer, row["text"])
        if len(ids) > max_prompt:
            skipped += 1
            continue
        prompts.append({**{k: v for k, v in row.items() if k != "text"}, "prompt_ids": list(ids)})
    return prompts, skipped


def _main_served(args) -> int:
    from verifier_service import quant

    if args.activations is not None:
        os.environ[quant.ACTIVATIONS_ENV] = quant.activation_mode(args.activations)
    import torch

    from .served_answers import answer_prompts_served, served_model

    torch.set_num_threads(args.threads)
    model = served_model(args.target)
    read = _read_prompts(args.prompts, model.tokenizer, args.max_prompt)
    if read is None:
        return 2
    prompts, skipped = read
    print(f"[answers] {len(prompts)} prompts x {args.samples} answers ({skipped} longer than {args.max_prompt} "
          f"tokens skipped), {quant.activation_mode()} activations", file=sys.stderr)
    info = answer_prompts_served(model, prompts, args.out_dir, samples=args.samples,
                                 temperature=args.temperature, max_new_tokens=args.max_new_tokens, topk=args.topk,
                                 shard_size=args.shard_size, slots=args.slots, seed=args.seed,
                                 progress=not args.no_progress)
    print(f"[answers] {json.dumps(info)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
