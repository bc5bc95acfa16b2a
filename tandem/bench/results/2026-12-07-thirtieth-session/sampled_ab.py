"""Seeded sampled plain decoding through Target.verify (2 threads): the coupled sample by a full-row noise
(before) against the one-pass candidate scan (after), alternated; ms a token. Also checks the same tokens."""
import os, sys, time, statistics as st
os.environ.setdefault("HF_HUB_OFFLINE", "1"); sys.path.insert(0, os.getcwd())
import torch
from verifier_service.target import Target
from verifier_service import torch_thread, acceptance
from tandem.coupling import coupled_token
from tandem.types import SamplingParams
new = acceptance.coupled_sample
def old(logits, sampling, position):
    ids = acceptance.support(logits, sampling)
    scaled = logits.double().cpu().numpy() / float(sampling.temperature)
    return coupled_token(scaled, None if ids is None else ids.cpu().numpy(), int(sampling.seed), position)
t = Target.load(sys.argv[1])
torch_thread.run(torch.set_num_threads, 2)
prompt = list(range(1000, 1100))
sp = SamplingParams(temperature=0.8, seed=1234)
def run(fn, name, n=96):
    acceptance.coupled_sample = fn
    t.start(name, prompt, sp); ms = []; toks = []
    for i in range(n):
        t0 = time.perf_counter(); o = t.verify(name, []); ms.append((time.perf_counter() - t0) * 1e3); toks.append(o.next_token)
    t.end(name); return ms, toks
res = {"before": [], "after": []}
for rep in range(4):
    a, ta = run(old, f"o{rep}"); b, tb = run(new, f"n{rep}")
    assert ta == tb, "tokens differ"
    res["before"] += a; res["after"] += b
for k, v in res.items(): print(f"{os.path.basename(sys.argv[1])[:30]:30s} {k}: median {st.median(v):.2f} ms a token")
