"""ms per drafted token of the .gguf drafter with 0..3 guessed rows, blocks of K continuing its own path over
Spec-Bench prompts (as a followed node drafts), 1 thread; alternated; checks the tokens are the same."""
import os, sys, json, time, statistics as st
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.getcwd())
from drafter_service.factory import load_drafter
from tandem.models import resolve
from tandem.types import SamplingParams
loc = resolve("default"); path = loc.directory / loc.gguf_file
g = load_drafter(path, threads=1)
tok = g.target.tokenizer
K = int(sys.argv[1]) if len(sys.argv) > 1 else 4
N = int(sys.argv[2]) if len(sys.argv) > 2 else 12
T = 128
qs = [json.loads(l) for l in open("/work/shared/data/spec_bench/question.jsonl")]
qs = qs[1::max(1, len(qs)//N)][:N]
prompts = []
for q in qs:
    ids = tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True)
    if hasattr(ids, "keys"): ids = ids["input_ids"]
    prompts.append(list(ids)[-300:])
def draft(name, prompt, G):
    g.guess_tokens = G
    ctx = list(prompt); g.propose(name, 0, ctx, 1, SamplingParams()); known = len(ctx)
    t0 = time.perf_counter(); out = []
    while len(out) < T:
        p = g.propose(name, known, ctx[known:], K, SamplingParams())
        known = len(ctx); new = [t.token_id for t in p.tokens]; ctx += new; out += new
    dt = time.perf_counter() - t0
    g.end_session(name)
    return out[:T], dt * 1e3 / len(out)
res = {G: [] for G in (0, 1, 2, 3)}
for i, pr in enumerate(prompts):
    outs = {}
    for G in (0, 1, 2, 3):
        outs[G], ms = draft(f"s{i}{G}", pr, G); res[G].append(ms)
    assert all(outs[G] == outs[0] for G in outs), f"prompt {i}: tokens differ"
base = st.median(res[0])
for G, v in res.items():
    print(f"K={K} guesses {G}: ms per drafted token median {st.median(v):.2f} (x{st.median(v)/base:.2f})  mean {st.mean(v):.2f}")
