import os, sys, time
os.environ["HF_HUB_OFFLINE"]="1"; sys.path.insert(0, os.getcwd())
import numpy as np, torch
torch.set_num_threads(int(sys.argv[1]))
from tandem.bench.random_gguf import random_tensor
from verifier_service.quant import QuantWeight
from verifier_service.greedy_head import GreedyHead
V, H = int(sys.argv[2]), int(sys.argv[3])
raw = random_tensor("Q6_K", V, H, 0.02, np.random.default_rng(0))
class B: pass
b = B(); b.blocks = QuantWeight("Q6_K", raw, V, H)
t0 = time.perf_counter(); g = GreedyHead(b); print("l1 at load %.2f s" % (time.perf_counter() - t0))
def tm(fn, reps=7):
    best = 1e9
    for _ in range(reps):
        t0 = time.perf_counter(); fn(); best = min(best, time.perf_counter() - t0)
    return best * 1e3
with torch.inference_mode():
    for w in (1, 2, 4, 8):
        h = b.blocks.rows(np.arange(w) * 97 + 5) * 4 + torch.randn(w, H) * 0.02
        out = torch.empty(w, V)
        ok = g.logits_into(h, out); full = b.blocks.matmul(h)
        assert ok and torch.equal(out.argmax(-1), full.argmax(-1))
        print(w, "cands", [int(torch.isfinite(out[r]).sum()) for r in range(w)], "full %.2f greedy %.2f ms" % (tm(lambda: b.blocks.matmul(h)), tm(lambda: g.logits_into(h, out))))
