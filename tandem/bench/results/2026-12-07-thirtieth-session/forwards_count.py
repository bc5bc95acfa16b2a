"""Forwards per drafted token of the .gguf node (by width), without and with a guessed row; asserts the same tokens.
Usage: python forwards_count.py BLOCK_LENGTH N_PROMPTS"""
import os, sys, json
os.environ.setdefault("HF_HUB_OFFLINE", "1"); sys.path.insert(0, os.getcwd())
from collections import Counter
from drafter_service.factory import load_drafter
from tandem.models import resolve
from tandem.types import SamplingParams
loc = resolve("default"); path = loc.directory / loc.gguf_file
g = load_drafter(path, threads=1); tok = g.target.tokenizer
K, N, T = int(sys.argv[1]), int(sys.argv[2]), 128
qs = [json.loads(l) for l in open("/work/shared/data/spec_bench/question.jsonl")]
qs = qs[1::max(1, len(qs)//N)][:N]
prompts = [list(tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True, return_dict=True)["input_ids"])[-300:] for q in qs]
widths = Counter(); feed = g.feed
def counted(kv, ids, keep):
    widths[len(ids)] += 1; return feed(kv, ids, keep)
g.feed = counted
def draft(name, prompt):
    ctx = list(prompt); g.propose(name, 0, ctx, 1, SamplingParams()); known = len(ctx); out = []
    widths.clear()
    while len(out) < T:
        p = g.propose(name, known, ctx[known:], K, SamplingParams()); known = len(ctx)
        new = [t.token_id for t in p.tokens]; ctx += new; out += new
    g.end_session(name); return out[:T], dict(widths), len(out)
for mode, G, jac in (("none", 0, False), ("ngram", 1, False)):
    g.guess_tokens = G
    tot = Counter(); n = 0; outs = []
    for i, pr in enumerate(prompts):
        o, w, m = draft(f"{mode}{i}", pr); outs.append(o); tot.update(w); n += m
    if mode == "none": base = outs
    assert outs == base
    cost = sum(c * (1.0 if w == 1 else 1.07 if w == 2 else 1.2) for w, c in tot.items())
    print(f"K={K} {mode:13s} forwards/token {sum(tot.values())/n:.3f}  widths {dict(sorted(tot.items()))}  est. cost/token {cost/n:.3f} step")
