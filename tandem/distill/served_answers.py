"""Teacher data from the served target: many answers at once through the verifier's own decoder.

``answers.answer_prompts`` runs the target through transformers in fp32, padded batches: about 80 answer
tokens a second on a 2-core CPU. The verifier's decoder (``verifier_service.decoder``: the GGUF file's blocks,
C kernels) runs one forward over the rows of many sessions, each over its own KV cache, so a batch of
answers costs little more than one; no padding, and a finished answer's slot takes the next one at once
(continuous batching). Each prompt is prefilled once; its samples start from a copy of its K/V.

Per answer: sample 0 is the greedy answer; samples 1.. are drawn at ``temperature`` from the target's full
distribution (a seeded generator per answer), so the drafter also sees the states a sampled answer
passes through. Every position keeps the target's top-k log-probabilities (untempered: the distribution
the drafter is trained to match), prompt positions included. Output: the teacher-pass files of
``answers.answer_prompts`` (same record format), written one shard at a time and resumable.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PREFILL_CHUNK = 256      # prompt rows a forward (bounds the [rows, vocabulary] logits held at once)


@dataclass
class _Prompt:
    row: dict
    ids: list[int]
    cache: object = None
    top_ids: np.ndarray | None = None          # [P, K] the prompt's rows (row i predicts token i + 1)
    top_logp: np.ndarray | None = None
    last: object = None                        # log-probs [V] after the whole prompt
    first: tuple = ()                          # (top ids [K], top log-probs [K]) of that last row


@dataclass
class _Answer:
    prompt: _Prompt
    sample: int
    cache: object
    rng: np.random.Generator
    tokens: list[int] = field(default_factory=list)
    ids: list[np.ndarray] = field(default_factory=list)
    lps: list[np.ndarray] = field(default_factory=list)


def _topk(logits, k: int):
    """(log-probs [n, V], top ids [n, k] int32, top log-probs [n, k] float16) of logits [n, V]."""
    import torch

    lp = torch.log_softmax(logits.float(), -1)
    v, i = lp.topk(k, -1)
    return lp, i.numpy().astype(np.int32), v.numpy().astype(np.float16)


def _choose(lp_row, answer: _Answer, temperature: float) -> int:
    """Greedy for sample 0, else a draw at ``temperature`` from the row's full distribution."""
    import torch

    if answer.sample == 0 or temperature <= 0:
        return int(lp_row.argmax())
    cdf = np.cumsum(torch.softmax(lp_row.double() / temperature, -1).numpy())
    return int(min(np.searchsorted(cdf, answer.rng.random() * cdf[-1], side="right"), cdf.shape[0] - 1))


def _prefill(decoder, prompt: _Prompt, topk: int) -> None:
    cache = decoder.new_cache()
    ids_parts, lp_parts, last = [], [], None
    for s in range(0, len(prompt.ids), PREFILL_CHUNK):
        lp, i, v = _topk(decoder.forward(cache, prompt.ids[s:s + PREFILL_CHUNK]), topk)
        ids_parts.append(i)
        lp_parts.append(v)
        last = lp[-1].clone()
    prompt.cache, prompt.last = cache, last
    # rows 0..P-2 predict prompt tokens 1..P-1; the last row predicts the first answer token
    allids, alllp = np.concatenate(ids_parts), np.concatenate(lp_parts)
    prompt.top_ids, prompt.top_logp = allids[:-1], alllp[:-1]
    prompt.first = (allids[-1], alllp[-1])


def generate_answers(decoder, prompts: list[dict], *, samples: int = 1, temperature: float = 0.8,
                     max_new_tokens: int = 128, topk: int = 8, slots: int = 16, eos_ids=(), seed: int = 0,
                     on_answer=None, progress=None) -> dict:
    """Answers every prompt ``samples`` times; ``on_answer(record)`` gets each finished teacher record (the
    format of ``answers.answer_prompts``). ``slots``: answers decoded together (rows a forward). A prompt
    that fills the target's context is left out (``skipped_prompts``); an answer ends where the context does."""
    import torch

    eos = {int(e) for e in eos_ids}
    context = decoder.max_length
    fits = [i for i, p in enumerate(prompts) if len(p["prompt_ids"]) < context]      # room for one answer token
    queue = [(p, s) for p in fits for s in range(samples)]
    queue.reverse()
    states: dict[int, _Prompt] = {}
    active: list[_Answer] = []
    t0, n_answer, n_prompt, forwards = time.perf_counter(), 0, 0, 0

    def finish(a: _Answer) -> None:
        nonlocal n_answer
        p = a.prompt
        steps = len(a.tokens) - 1               # rows after the first answer token's (which the prompt's last row gave)
        ids = np.concatenate([p.top_ids, p.first[0][None]] + [r[None] for r in a.ids[:steps]])
        lps = np.concatenate([p.top_logp, p.first[1][None]] + [r[None] for r in a.lps[:steps]])
        rec = {"tokens": np.asarray(p.ids + a.tokens, dtype=np.int32), "start": len(p.ids), "top_ids": ids,
               "top_logp": lps, "source": p.row.get("source", "answers"), "question_id": p.row.get("question_id"),
               "category": p.row.get("category", ""), "sample": a.sample,
               "temperature": 0.0 if a.sample == 0 else temperature}
        n_answer += len(a.tokens)
        if on_answer is not None:
            on_answer(rec)

    while queue or active:
        while queue and len(active) < slots:
            pi, s = queue.pop()
            prompt = states.get(pi)
            if prompt is None:
                prompt = states[pi] = _Prompt(prompts[pi], list(prompts[pi]["prompt_ids"]))
                _prefill(decoder, prompt, topk)
                n_prompt += len(prompt.ids)
            cache = decoder.new_cache()
            cache.load_prefix(prompt.cache.kv, prompt.cache.length, min(context, len(prompt.ids) + max_new_tokens))
            a = _Answer(prompt, s, cache, np.random.default_rng([seed, pi, s]))
            a.tokens.append(_choose(prompt.last, a, temperature))
            if s == samples - 1:                # its last answer has its K/V: the prompt's copy goes
                states.pop(pi).cache = None
            if a.tokens[-1] in eos or max_new_tokens <= 1 or len(prompt.ids) + 1 >= context:
                finish(a)
            else:
                active.append(a)
        if not active:
            continue
        logits = decoder.forward_blocks([(a.cache, [a.tokens[-1]]) for a in active])
        forwards += 1
        done = []
        lp, i, v = _topk(torch.cat(logits), topk)                      # [rows, V]: one row an answer
        for r, a in enumerate(active):
            a.ids.append(i[r])
            a.lps.append(v[r])
            a.tokens.append(_choose(lp[r], a, temperature))
            if a.tokens[-1] in eos or len(a.tokens) >= max_new_tokens or a.cache.length + 1 >= context:
                done.append(a)
        for a in done:
            active.remove(a)
            finish(a)
        if progress is not None:
            progress(n_answer, n_prompt, time.perf_counter() - t0)
    return {"answer_tokens": n_answer, "prompt_tokens": n_prompt, "forwards": forwards,
            "skipped_prompts": len(prompts) - len(fits),
            "seconds": round(time.perf_counter() - t0, 1)}


def served_model(target: str):
    """The target as the verifier loads it (``TargetModel``); SystemExit naming the path it runs on when that
    is not the verifier's decoder (transformers' forward runs one session a forward)."""
    from verifier_service.target_model import TargetModel

    model = TargetModel.load(target)
    if model.decoder is None:
        raise SystemExit(f"--engine served needs the verifier's decoder; {target} runs on {model.path}")
    return model


def answer_prompts_served(model, prompts: list[dict], out_dir: str | os.PathLike, *, samples: int = 1,
                          temperature: float = 0.8, max_new_tokens: int = 128, topk: int = 8,
                          shard_size: int = 256, slots: int = 16, seed: int = 0, progress: bool = True) -> dict:
    """``answers.answer_prompts`` through the decoder of ``model`` (``served_model``): shards of ``shard_size``
    prompts (all their samples), existing shards kept (a rerun resumes)."""
    import torch
    from tqdm import tqdm

    from verifier_service import torch_thread

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"[answers] {model.path}", file=sys.stderr)
    eos = model.info.eos_token_ids
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]["prompt_ids"]), i))
    shards = [order[s:s + shard_size] for s in range(0, len(order), shard_size)]
    bar = tqdm(total=len(prompts) * samples, desc="answers", unit="answer", disable=not progress, file=sys.stderr)
    t0, totals, written = time.perf_counter(), {"answer_tokens": 0, "prompt_tokens": 0}, []
    for k, shard in enumerate(shards):
        path = out_dir / f"answers_{k:03d}.pt"
        written.append(str(path))
        if path.exists():
            bar.update(len(shard) * samples)
            continue
        saved = []

        def keep(rec):
            saved.append(rec)
            bar.update(1)

        def shown(n_answer, n_prompt, s):
            bar.set_postfix(answer_tok_s=f"{(totals['answer_tokens'] + n_answer) / (time.perf_counter() - t0):.0f}")

        info = torch_thread.run(generate_answers, model.decoder, [prompts[i] for i in shard], samples=samples,
                                temperature=temperature, max_new_tokens=max_new_tokens, topk=topk, slots=slots,
                                eos_ids=eos, seed=seed + k, on_answer=keep, progress=shown)
        for key in ("answer_tokens", "prompt_tokens", "skipped_prompts"):
            totals[key] = totals.get(key, 0) + info[key]
        tmp = path.with_suffix(".tmp")
        torch.save(saved, tmp)
        os.replace(tmp, path)
    bar.close()
    return {"shards": written, **totals, "seconds": round(time.perf_counter() - t0, 1)}
