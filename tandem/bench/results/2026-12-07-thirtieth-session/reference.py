"""What head_q4.py, head_fp32.py and old_path.py compare against: the target's fp32 greedy output on
Spec-Bench prompts (chat template, the last 400 prompt tokens), and a target loaded with a given arithmetic."""
import json
import os

import torch

from verifier_service.target import Target

QUESTIONS = "/work/shared/data/spec_bench/question.jsonl"


def load(path: str, activations: str) -> Target:
    """The target at ``path`` with ``activations`` ('fp32' or 'int8')."""
    os.environ["TANDEM_ACTIVATIONS"] = activations
    return Target.load(path)


def greedy(dec, ctx: list[int], n: int) -> list[int]:
    """``n`` greedy tokens of decoder ``dec`` after ``ctx``, one forward a token."""
    c = dec.new_cache(); lg = dec.forward(c, ctx, True); out = []
    for _ in range(n):
        t = int(lg[-1].argmax()); out.append(t); lg = dec.forward(c, [t], False)
    return out


def fp32_greedy(path: str, n: int, tokens: int) -> tuple[Target, list[tuple[list[int], list[int]]]]:
    """(the fp32 target, [(prompt ids, its greedy output)] for ``n`` Spec-Bench prompts spread over the file)."""
    qs = [json.loads(l) for l in open(QUESTIONS)]
    qs = qs[::max(1, len(qs) // n)][:n]
    t32 = load(path, "fp32")
    seqs = []
    with torch.inference_mode():
        for q in qs:
            ids = t32.tokenizer.apply_chat_template([{"role": "user", "content": q["turns"][0]}],
                                                    add_generation_prompt=True)
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            ids = list(ids)[-400:]
            seqs.append((ids, greedy(t32.decoder, ids, tokens)))
    return t32, seqs
