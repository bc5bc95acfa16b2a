"""Prefill of 512 tokens in chunks of 512 / 256 / 128 / 32 rows through the verifier's decoder, on the
main thread and on the torch thread, twice: tok/s.

    python prefill_chunks.py FILE.gguf
"""
import os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, "/work/main")
import torch
from verifier_service import torch_thread
from verifier_service.target import Target
torch.set_num_threads(2)
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
for rep in range(2):
    for chunk in (512, 256, 128, 32):
        main = prefill(chunk)
        tt = torch_thread.run(prefill, chunk)
        print(f"chunk {chunk:3d}: main thread {main:5.0f} tok/s, torch thread {tt:5.0f} tok/s", flush=True)
