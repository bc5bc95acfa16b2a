import os, sys, time, statistics as st
os.environ.setdefault("HF_HUB_OFFLINE", "1"); sys.path.insert(0, os.getcwd())
import torch
from verifier_service.target import Target
from verifier_service import torch_thread
from tandem.types import SamplingParams
t = Target.load(sys.argv[1]); torch_thread.run(torch.set_num_threads, 2)
tok = t.tokenizer
prompt = tok("The history of the city of Rome begins with")["input_ids"]
for rep in range(2):
    for sp in (SamplingParams(temperature=0.8, seed=5), SamplingParams(temperature=0.8, top_p=0.9, seed=5), SamplingParams(temperature=0.8, top_k=40, seed=5), SamplingParams()):
        name=f"{rep}{sp.top_p}{sp.top_k}{sp.temperature}"; t.start(name, prompt, sp); ms=[]
        for i in range(96):
            t0=time.perf_counter(); t.verify(name, []); ms.append((time.perf_counter()-t0)*1e3)
        t.end(name)
        print(f"T {sp.temperature} top_p {sp.top_p} top_k {sp.top_k}: median {st.median(ms):.2f} ms a token, max {max(ms):.1f}")
