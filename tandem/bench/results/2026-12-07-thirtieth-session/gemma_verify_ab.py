"""Gemma, 2 threads: Target.verify plain rounds vs decoder.forward steps, alternated in one process."""
import os, sys, time, statistics as st
os.environ.setdefault("HF_HUB_OFFLINE", "1"); sys.path.insert(0, os.getcwd())
import torch
from verifier_service.target import Target
from verifier_service import torch_thread
from tandem.types import SamplingParams
t = Target.load(sys.argv[1]); dec = t.decoder
torch_thread.run(torch.set_num_threads, 2)
prompt = list(range(1000, 1100))
def direct(n=64):
    def run():
        out = []
        with torch.inference_mode():
            c = dec.new_cache(); lg = dec.forward(c, prompt, True)
            for i in range(n):
                t0 = time.perf_counter(); lg = dec.forward(c, [int(lg[-1].argmax())], False); out.append((time.perf_counter()-t0)*1e3)
        return out
    return torch_thread.run(run)
def served(name, n=64):
    t.start(name, prompt, SamplingParams()); wall = []; comp = []
    for i in range(n):
        t0 = time.perf_counter(); o = t.verify(name, []); wall.append((time.perf_counter()-t0)*1e3); comp.append(o.compute_ms)
    t.end(name); return wall, comp
r = {"direct": [], "verify wall": [], "verify compute": []}
for rep in range(4):
    r["direct"] += direct()
    w, c = served(f"s{rep}"); r["verify wall"] += w; r["verify compute"] += c
for k, v in r.items(): print(f"{k:15s} median {st.median(v):.2f} min {min(v):.2f}")
