"""Greedy agreement of the GGUF fast path with transformers' own forward of the same file.

    python -m tandem.bench.reference_agreement --target PATH.gguf --prompts 20 --tokens 64

For each prompt (Spec-Bench first turns, chat template of the target), the fast path (``Target`` on the
GGUF file) decodes ``--tokens`` tokens greedily, one plain step each; transformers (which dequantizes the
same file to fp32) then runs one forward over prompt + those tokens, and at every generated position its
argmax is compared with the fast path's token. A differing position is reported with transformers' logit
gap between its own choice and the fast path's: a near-tie (gap at fp32 rounding level) is the summation
order of two correct forwards, not a bug. Also reported: the largest |logit| difference over all positions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

SPEC_BENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"


def prompts(n: int) -> list[str]:
    """First turns of ``n`` Spec-Bench questions, categories interleaved (falls back to fixed prompts)."""
    path = SPEC_BENCH if SPEC_BENCH.exists() else Path("/work/shared/data/spec_bench/question.jsonl")
    if not path.exists():
        base = ["Write a short poem about the sea.", "Explain what a hash table is.", "What is 17 * 23?",
                "Translate 'good morning' into French.", "List three uses of copper."]
        return [base[i % len(base)] + ("" if i < len(base) else f" ({i})") for i in range(n)]
    by_category: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        q = json.loads(line)
        by_category.setdefault(q["category"], []).append(q["turns"][0])
    out, i = [], 0
    while len(out) < n:
        for items in by_category.values():
            if i < len(items) and len(out) < n:
                out.append(items[i])
        i += 1
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="a .gguf file (or 'default')")
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch

    from tandem.types import SamplingParams
    from verifier_service import torch_thread
    from verifier_service.target import Target

    if args.threads:
        torch.set_num_threads(args.threads)
        torch_thread.run(torch.set_num_threads, args.threads)
    target = Target.load(args.target, prefill_chunk=-1)       # the served default: its prompt chunks too
    print(f"# Greedy agreement with transformers: {target.info.model_name}")
    print(f"- {target.startup_line()}")
    if target.gguf is None:
        print("the target is not on the GGUF fast path: nothing to compare", file=sys.stderr)
        return 2
    tok = target.tokenizer
    runs = []
    for i, text in enumerate(prompts(args.prompts)):
        chat = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
        ids = tok(chat, add_special_tokens=False)["input_ids"]
        first, _ = target.start(f"a{i}", ids, SamplingParams())
        out = [first]
        while len(out) < args.tokens:
            out.append(target.verify(f"a{i}", []).next_token)
        target.end(f"a{i}")
        runs.append((ids, out))
    model = target.model                          # transformers' load of the same file (fp32)
    identical, ties, worst = 0, [], 0.0
    from verifier_service.kv_cache import TargetSession

    for i, (ids, out) in enumerate(runs):
        seq = ids + out
        with torch.inference_mode():
            ref = model(torch.tensor([seq])).logits[0, len(ids) - 1:len(seq) - 1].float()    # predicts out[j]
        session = TargetSession("ref", target._new_cache(), 0, -1, SamplingParams(), torch.Generator())
        fast = target._forward(session, seq)[len(ids) - 1:len(seq) - 1]
        worst = max(worst, float((fast - ref).abs().max()))
        choice = ref.argmax(-1).tolist()
        differing = [(j, choice[j], out[j], float(ref[j, choice[j]] - ref[j, out[j]]))
                     for j in range(len(out)) if choice[j] != out[j]]
        if not differing:
            identical += 1
        for j, theirs, ours, gap in differing[:1]:                 # after the first, the contexts differ anyway
            ties.append((i, j, theirs, ours, gap))
        print(f"  prompt {i}: {'identical' if not differing else f'first difference at token {differing[0][0]}'}",
              flush=True)
    print(f"- {identical} of {len(runs)} prompts x {args.tokens} tokens identical; max |logit| difference "
          f"(same context) {worst:.2e}")
    for i, j, theirs, ours, gap in ties:
        print(f"  prompt {i}, token {j}: transformers {theirs}, fast path {ours}, logit gap {gap:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
