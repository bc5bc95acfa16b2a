"""The default target's fp32 plain steps in a loop on 1 thread (pin it with taskset): a verifier's memory
traffic beside another process. Runs until killed."""
import os, sys
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.getcwd())
import torch
from verifier_service import torch_thread
from verifier_service.target import Target
torch.set_num_threads(1); torch_thread.run(torch.set_num_threads, 1)
t = torch_thread.run(Target.load, "default")
dec = t.decoder
ids = t._probe_ids(300)
def loop():
    while True:
        c = dec.new_cache()
        with torch.inference_mode():
            dec.forward(c, ids[:100], True)
            for i in range(150):
                dec.forward(c, ids[100 + i:101 + i], True)
torch_thread.run(loop)
