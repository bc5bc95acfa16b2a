"""Training data for drafter distillation.

A *record* is one token sequence of the target's vocabulary: ``prompt_ids`` (the templated prompt)
and ``output_ids`` (an answer, usually written by the target itself). A *teacher pass* runs the
target over records (teacher forcing, no generation) and stores, for every position, the target's
top-k next-token ids and log-probabilities: the student learns the target's greedy choice (top-1)
and its distribution (KL on the top-k) from them.

The Spec-Bench split: questions with ``question_id % 4 == 0`` are the training split; every other
question is held out for benchmarks and must never be trained on (``is_training_question``).
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..models import model_device

SHARED_DATA = Path(os.environ.get("TANDEM_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
DEFAULT_CORPUS = SHARED_DATA / "distill" / "smollm2_135m_instruct_samples.jsonl"
SPEC_BENCH = SHARED_DATA / "spec_bench" / "question.jsonl"
SPLIT_MODULUS = 4


def is_training_question(question_id: int) -> bool:
    """The training split of Spec-Bench: question_id % 4 == 0. All others are held out."""
    return int(question_id) % SPLIT_MODULUS == 0


@dataclass
class Record:
    prompt_ids: list[int]
    output_ids: list[int]
    source: str = ""
    question_id: int | None = None
    category: str = ""
    meta: dict = field(default_factory=dict)


def load_jsonl_records(path: str | os.PathLike, source: str | None = None, check_split: bool = True) -> list[Record]:
    """Reads records from JSONL: ``prompt_ids`` (optional), ``output_ids`` (or ``ids``), and optional
    ``question_id``/``category``. Rows of held-out Spec-Bench questions are refused (ValueError)."""
    path = Path(path)
    out: list[Record] = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            qid = row.get("question_id")
            if check_split and qid is not None and not is_training_question(qid):
                raise ValueError(f"{path}: question_id {qid} is a held-out Spec-Bench question (id % 4 != 0); "
                                 "training on it would contaminate the benchmark")
            out.append(Record(list(row.get("prompt_ids", [])), list(row.get("output_ids", row.get("ids", []))),
                              source or path.name, qid, row.get("category", ""),
                              {k: row[k] for k in ("sample",) if k in row}))
    return out


def spec_bench_questions(split: str = "heldout", path: str | os.PathLike = SPEC_BENCH) -> list[dict]:
    """Spec-Bench questions of one split: 'train' (id % 4 == 0), 'heldout' (the rest) or 'all'."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    if split == "all":
        return rows
    want = split == "train"
    return [r for r in rows if is_training_question(r["question_id"]) == want]


def chat_prompt_ids(tokenizer, text: str) -> list[int]:
    """The templated first-turn prompt (``add_generation_prompt=True``), as token ids."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    return list(tokenizer(text)["input_ids"])


# ----------------------------------------------------------------------------------------------
# Generation by the target (training samples for targets without a corpus; held-out references)
# ----------------------------------------------------------------------------------------------

def generate(model, prompts: list[list[int]], max_new_tokens: int, *, greedy: bool = True, temperature: float = 0.8,
             top_p: float = 0.95, seed: int = 0, batch_size: int = 8, eos_ids: tuple[int, ...] = (),
             pad_id: int = 0, progress: bool = True) -> list[list[int]]:
    """Batched generation with left padding; returns the new tokens of each prompt (cut after EOS).

    Prompts are sorted by length to keep padding small; the output keeps the input order.
    """
    import torch
    from tqdm import tqdm

    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    results: list[list[int] | None] = [None] * len(prompts)
    device = model_device(model)
    gen = torch.Generator(device=device).manual_seed(seed)  # sampled outputs are reproducible per device type
    bar = tqdm(total=len(prompts), desc="generate", unit="prompt", disable=not progress, file=sys.stderr)
    eos = set(int(e) for e in eos_ids)
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        batch = [prompts[i] for i in idx]
        width = max(len(p) for p in batch)
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, p in enumerate(batch):
            input_ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        new = _generate_batch(model, input_ids.to(device), mask.to(device), max_new_tokens, greedy, temperature,
                              top_p, gen, eos)
        for r, i in enumerate(idx):
            results[i] = new[r]
        bar.update(len(idx))
    bar.close()
    return [r or [] for r in results]


def _generate_batch(model, input_ids, mask, max_new_tokens, greedy, temperature, top_p, gen, eos):
    """A plain KV-cache decoding loop (exact greedy argmax; nucleus sampling otherwise)."""
    import torch

    B = input_ids.shape[0]
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    out = [[] for _ in range(B)]
    done = [False] * B
    with torch.no_grad():
        # the prefill's head runs on the last position only (the others' logits are never used)
        res = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=True,
                    logits_to_keep=1)
        past = res.past_key_values
        logits = res.logits[:, -1, :]
        next_pos = position_ids[:, -1:] + 1
        for _ in range(max_new_tokens):
            if greedy:
                tok = logits.argmax(-1)
            else:
                probs = torch.softmax(logits.float() / temperature, -1)
                sp, si = probs.sort(-1, descending=True)
                cum = sp.cumsum(-1)
                sp[(cum - sp) > top_p] = 0
                choice = torch.multinomial(sp / sp.sum(-1, keepdim=True), 1, generator=gen).squeeze(-1)
                tok = si.gather(-1, choice[:, None]).squeeze(-1)
            for r, t in enumerate(tok.tolist()):  # one copy to the host a step (not one per row on a GPU)
                if not done[r]:
                    out[r].append(t)
                    done[r] = t in eos
            if all(done):
                break
            mask = torch.cat([mask, mask.new_ones((B, 1))], dim=1)
            res = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos, past_key_values=past,
                        use_cache=True)
            past = res.past_key_values
            logits = res.logits[:, -1, :]
            next_pos = next_pos + 1
    return out


# ----------------------------------------------------------------------------------------------
# Teacher pass: target top-k over existing text
# ----------------------------------------------------------------------------------------------

def teacher_pass(model, records: list[Record], out_path: str | os.PathLike, *, topk: int = 8, max_len: int = 2048,
                 answers_per_batch: int = 12, progress: bool = True, desc: str = "teacher") -> dict:
    """Runs the target over records (grouped by prompt: the prompt is encoded once, its KV cache reused
    for all answers to it) and saves, per record, ``tokens`` (prompt + answer), ``start`` (where the
    answer begins), ``top_ids``/``top_logp`` [len(tokens) - 1, topk]: the target's top-k next tokens after
    each position. Writes ``out_path`` (a torch file) and returns summary counts.
    """
    import torch
    from tqdm import tqdm

    device = model_device(model)
    groups: dict[tuple, list[Record]] = defaultdict(list)
    for r in records:
        groups[tuple(r.prompt_ids)].append(r)
    total = sum(len(r.prompt_ids) + len(r.output_ids) for r in records)
    bar = tqdm(total=len(records), desc=desc, unit="seq", disable=not progress, file=sys.stderr)
    saved = []
    t0 = time.perf_counter()
    n_tok = 0
    with torch.no_grad():
        for prompt, recs in groups.items():
            prompt = list(prompt)[-max_len:]
            p_ids = p_lp = None
            cache = None
            if prompt:
                res = model(input_ids=torch.tensor([prompt], device=device), use_cache=True)
                lp = torch.log_softmax(res.logits[0].float(), -1)
                p_lp, p_ids = (t.cpu() for t in lp.topk(topk, -1))
                cache = res.past_key_values
                n_tok += len(prompt)
            for b in range(0, len(recs), answers_per_batch):
                chunk = recs[b:b + answers_per_batch]
                room = max(1, max_len - len(prompt))
                answers = [r.output_ids[:room] for r in chunk]
                width = max(len(a) for a in answers)
                if width == 0:
                    bar.update(len(chunk))
                    continue
                x = torch.zeros((len(chunk), width), dtype=torch.long)
                for i, a in enumerate(answers):
                    x[i, :len(a)] = torch.tensor(a, dtype=torch.long)
                x = x.to(device)
                if cache is not None:
                    import copy
                    c = copy.deepcopy(cache)
                    c.batch_repeat_interleave(len(chunk))
                    res = model(input_ids=x, past_key_values=c, use_cache=True)
                else:
                    res = model(input_ids=x, use_cache=False)
                lp = torch.log_softmax(res.logits.float(), -1)
                a_lp, a_ids = (t.cpu() for t in lp.topk(topk, -1))
                for i, (r, a) in enumerate(zip(chunk, answers)):
                    n_tok += len(a)
                    if prompt:
                        ids = torch.cat([p_ids, a_ids[i, :max(len(a) - 1, 0)]], 0)
                        lps = torch.cat([p_lp, a_lp[i, :max(len(a) - 1, 0)]], 0)
                    else:
                        ids, lps = a_ids[i, :len(a) - 1], a_lp[i, :len(a) - 1]
                    saved.append({
                        "tokens": np.asarray(prompt + a, dtype=np.int32),
                        "start": len(prompt),
                        "top_ids": ids.numpy().astype(np.int32),
                        "top_logp": lps.numpy().astype(np.float16),
                        "source": r.source, "question_id": r.question_id, "category": r.category,
                    })
                bar.update(len(chunk))
                bar.set_postfix(tok_s=f"{n_tok / (time.perf_counter() - t0):.0f}")
    bar.close()
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_suffix(".tmp")
    torch.save(saved, tmp)
    os.replace(tmp, out_path)
    return {"records": len(saved), "tokens": n_tok, "seconds": round(time.perf_counter() - t0, 1), "total": total}


def load_shards(paths: list[str | os.PathLike]) -> list[dict]:
    import torch

    out = []
    for p in paths:
        out.extend(torch.load(p, weights_only=False))
    return out


# ----------------------------------------------------------------------------------------------
# Offline text (no download): Python's own standard-library sources and docs on this machine
# ----------------------------------------------------------------------------------------------

def offline_text_records(tokenizer, max_tokens: int, seq_len: int = 512, seed: int = 0) -> list[Record]:
    """Chunks of text that exist on any machine with Python: the standard library's sources
    (``sysconfig.get_paths()['stdlib']``), shuffled deterministically. Records have no prompt."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "test" not in p.parts and "site-packages" not in p.parts)
    random.Random(seed).shuffle(files)
    out: list[Record] = []
    n = 0
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        ids = tokenizer(text)["input_ids"]
        for i in range(0, len(ids) - 32, seq_len):
            chunk = ids[i:i + seq_len]
            out.append(Record([], chunk, source=f"stdlib:{f.relative_to(root)}"))
            n += len(chunk)
            if n >= max_tokens:
                return out
    return out


def split_records(records: list[Record], heldout_fraction: float = 0.05, seed: int = 0) -> tuple[list, list]:
    """Splits by prompt (all answers to one prompt go to the same side) for the progress metric."""
    keys = sorted({(r.question_id, tuple(r.prompt_ids[:64])) for r in records}, key=str)
    random.Random(seed).shuffle(keys)
    n_val = max(1, math.ceil(len(keys) * heldout_fraction)) if len(keys) > 1 else 0
    val = set(keys[:n_val])
    tr = [r for r in records if (r.question_id, tuple(r.prompt_ids[:64])) not in val]
    va = [r for r in records if (r.question_id, tuple(r.prompt_ids[:64])) in val]
    return tr, va


def _source_counts(recs: list[dict]) -> dict[str, int]:
    """Records per source kind (the part of ``source`` before ':', e.g. 'package', 'stdlib', 'spec_bench')."""
    counts: dict[str, int] = defaultdict(int)
    for r in recs:
        counts[str(r.get("source")).split(":")[0]] += 1
    return dict(sorted(counts.items()))


def shard_manifest(paths: list[str | os.PathLike]) -> list[dict]:
    """What teacher-pass files hold: per file, records, tokens, sources and Spec-Bench question ids."""
    import torch

    out = []
    for p in paths:
        recs = torch.load(p, weights_only=False)
        qids = sorted({int(r["question_id"]) for r in recs if r.get("question_id") is not None})
        out.append({"source": str(p), "kind": "teacher-pass file",
                    "records": len(recs), "answer_tokens": int(sum(len(r["tokens"]) - r["start"] for r in recs)),
                    "prompt_tokens": int(sum(r["start"] for r in recs)),
                    "from": _source_counts(recs),
                    "question_ids": qids,
                    "all_training_split": all(is_training_question(q) for q in qids)})
    return out
