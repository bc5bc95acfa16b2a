import os, sys, time
os.environ["HF_HUB_OFFLINE"]="1"; sys.path.insert(0, os.getcwd())
import numpy as np, torch
from verifier_service.target import Target
from verifier_service.greedy_head import GreedyHead
from verifier_service import torch_thread
thr = int(sys.argv[2]) if len(sys.argv) > 2 else 1
torch_thread.run(torch.set_num_threads, thr)
t = Target.load(sys.argv[1])
dec = t.decoder
gh = GreedyHead(dec.weights.head)
H = []
orig = type(dec)._head
def hooked(self, h, *a):
    H.append(h.detach().clone()); return orig(self, h, *a)
type(dec)._head = hooked
ids = t.tokenizer("The quick brown fox jumps over the lazy dog. Once upon a time, in a land far away,")["input_ids"]
def gen():
    with torch.inference_mode():
        c = dec.new_cache(); lg = dec.forward(c, ids, True)
        for i in range(40):
            lg = dec.forward(c, [int(lg[-1].argmax())], True)
torch_thread.run(gen)
type(dec)._head = orig
h = torch.cat(H)
def check():
    bad = 0; cands = []
    for w in (1, 4):
        for i in range(0, len(h) - w, 3):
            x = h[i:i+w]
            full = dec._head(x)
            out = torch.empty(w, dec.spec.vocab)
            assert gh.logits_into(x, out)
            for r in range(w):
                fin = torch.isfinite(out[r])
                assert torch.equal(out[r][fin], full[r][fin]), "values differ"
                if int(out[r].argmax()) != int(full[r].argmax()): bad += 1
                cands.append(int(fin.sum()))
    print("rows", len(cands), "argmax mismatches", bad, "candidates median", np.median(cands), "max", max(cands))
    def tm(fn, reps=20):
        best = 1e9
        for _ in range(reps):
            t0 = time.perf_counter(); fn(); best = min(best, time.perf_counter() - t0)
        return best * 1e3
    for w in (1, 2, 4, 8):
        x = h[:w]; out = torch.empty(w, dec.spec.vocab)
        print("width", w, "full head %.2f ms" % tm(lambda: dec._head(x)), "greedy head %.2f ms" % tm(lambda: gh.logits_into(x, out)),
              "bounds only %.2f ms" % tm(lambda: gh.candidates_of(x)))
torch_thread.run(check)
