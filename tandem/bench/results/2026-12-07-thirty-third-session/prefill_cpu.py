"""Prefill of 512 tokens in the served path's 32-row chunks, 1 thread, CPU time of the torch thread (a shared
host's other work does not count), best of --repeats. Run from a tree root: python prefill_cpu.py FILE"""
import os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.getcwd())
import torch
from verifier_service import torch_thread
from verifier_service.target import Target
torch.set_num_threads(1); torch_thread.run(torch.set_num_threads, 1)
t = torch_thread.run(Target.load, sys.argv[1])
dec = t.decoder
N = int(os.environ.get("TOKENS", "512"))
ids = t._probe_ids(N)
def prefill():
    c = dec.new_cache()
    t0 = time.thread_time()
    with torch.inference_mode():
        for i in range(0, N, 32):
            dec.forward(c, ids[i:i + 32], True)
    return (time.thread_time() - t0) * 1e3
best = min(torch_thread.run(prefill) for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 3))
print(f"prefill of {N} tokens, 32-row chunks, 1 thread: {best:.0f} ms CPU ({N / best * 1e3:.0f} tok/s)")
