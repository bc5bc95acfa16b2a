"""Prefill of 512 tokens in 32-row chunks (the served path's exact chunks), best of 4, 2 threads.

    python chunk32.py TARGET        (run from the tree to time: it imports that tree's kernels)
"""
import os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.getcwd())
import torch
from verifier_service import torch_thread
from verifier_service.target import Target
torch_thread.run(torch.set_num_threads, 2)
t = torch_thread.run(Target.load, sys.argv[1])
dec = t.decoder
ids = t._probe_ids(512)
def prefill(chunk):
    c = dec.new_cache()
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, 512, chunk):
            dec.forward(c, ids[i:i + chunk], True)
    return 512 / (time.perf_counter() - t0)
best = max(torch_thread.run(prefill, 32) for _ in range(4))
print(f"{best:.0f} tok/s (chunks of 32, best of 4)")
