"""int8 drafter with its head requantized (Q8_0 -> Q4_0/Q4_1/Q5_0): step ms and argmax agreement with fp32 greedy."""
import os, sys, time, statistics as st
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.getcwd())
import numpy as np, torch
torch.set_num_threads(1)
import gguf
from gguf import quants
from verifier_service.weights import BlockWeight
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import fp32_greedy, greedy, load
path, n, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t32, seqs = fp32_greedy(path, n, T)
del t32
t8 = load(path, "int8"); dec = t8.decoder
orig = dec.weights.head
r = gguf.GGUFReader(path)
emb = [t for t in r.tensors if t.name == "token_embd.weight"][0]
Wf = quants.dequantize(emb.data, emb.tensor_type)           # [vocab, hidden] float32
heads = {"Q8_0": orig}
for k in sys.argv[4:]:
    qt = getattr(gguf.GGMLQuantizationType, k)
    raw = quants.quantize(Wf, qt)
    heads[k] = BlockWeight(k, raw, Wf.shape[0], Wf.shape[1])
def agree():
    a = tot = 0
    with torch.inference_mode():
        for ids, out in seqs:
            c = dec.new_cache(); lp = dec.forward(c, ids, True); lg = dec.forward(c, out[:-1], False)
            pred = [int(lp[-1].argmax())] + [int(x.argmax()) for x in lg]
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
        print(k, "agree %.4f" % agree() if rep == 0 else "", "step %.2f ms" % step(), flush=True)
