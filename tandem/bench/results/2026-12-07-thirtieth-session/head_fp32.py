"""int8 drafter with an fp32-activation head: argmax agreement with fp32 greedy, step ms (1 thread)."""
import os, sys, time, statistics as st
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.getcwd())
import numpy as np, torch
torch.set_num_threads(1)
import gguf
from verifier_service.weights import BlockWeight
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import fp32_greedy, greedy, load
path, n, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t32, seqs = fp32_greedy(path, n, T)
head32 = t32.decoder.weights.head
t8 = load(path, "int8"); dec = t8.decoder
heads = {"int8 head": dec.weights.head, "fp32 head": head32}
def agree():
    a = tot = 0; margins = []
    with torch.inference_mode():
        for ids, out in seqs:
            c = dec.new_cache(); lp = dec.forward(c, ids, True); lg = dec.forward(c, out[:-1], False)
            rows = torch.cat([lp[-1:], lg])
            pred = rows.argmax(-1).tolist()
            a += sum(int(p == o) for p, o in zip(pred, out)); tot += len(out)
    return a / tot
def step():
    ts = []
    with torch.inference_mode():
        c = dec.new_cache(); dec.forward(c, list(range(200, 400)), True)
        for i in range(100):
            t0 = time.perf_counter(); dec.forward(c, [5], True); ts.append(time.perf_counter() - t0); c.crop(200)
    return st.median(ts) * 1e3
for rep in range(2):
    for k, h in heads.items():
        dec.weights.head = h
        print(k, ("agree %.4f" % agree()) if rep == 0 else "", "step %.2f ms" % step(), flush=True)
