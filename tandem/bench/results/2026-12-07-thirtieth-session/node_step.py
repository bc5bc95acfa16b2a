import os, sys, time, statistics as st
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.getcwd())
import torch, numpy as np
from drafter_service.factory import load_drafter
from tandem.models import resolve
from tandem.types import SamplingParams
from verifier_service import torch_thread
loc = resolve("default"); path = loc.directory / loc.gguf_file
g = load_drafter(path, threads=1)
dec = g.decoder
prompt = list(range(200, 400))
def direct(n=32):
    def run():
        c = dec.new_cache(); lg = dec.forward_blocks([(c, prompt)], [1])[0]; out=[]
        for i in range(n):
            t0=time.perf_counter(); lg = dec.forward_blocks([(c, [int(lg[-1].argmax())])], [1])[0]; out.append((time.perf_counter()-t0)*1e3)
        return out
    return torch_thread.run(run)
def prop(name, n=64, k=4):
    ctx, known, out = list(prompt), 0, []
    g.propose(name, 0, ctx, 1, SamplingParams()); known=len(ctx)
    for i in range(n//k):
        t0 = time.perf_counter()
        p = g.propose(name, known, ctx[known:], k, SamplingParams())
        out.append((time.perf_counter()-t0)*1e3/k)
        known = len(ctx); ctx += [t.token_id for t in p.tokens]
    g.end_session(name); return out
r={"direct":[], "propose":[]}
for rep in range(4):
    r["direct"] += direct(); r["propose"] += prop(f"s{rep}")
for k,v in r.items(): print(k, "median %.2f min %.2f" % (st.median(v), min(v)))
import cProfile, pstats
cProfile.run("prop('prof', 64, 4)", "/tmp/b30/prof.out")
pstats.Stats("/tmp/b30/prof.out").sort_stats("cumtime").print_stats(25)
