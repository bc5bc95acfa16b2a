import os, sys, json
os.environ.setdefault("HF_HUB_OFFLINE", "1"); sys.path.insert(0, os.getcwd())
import numpy as np, torch, gguf
torch.set_num_threads(2)
from verifier_service.target import Target
from verifier_service import decoder as D
F = os.path.expanduser("~/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf")
reader = gguf.GGUFReader(F)
t = {x.name: x for x in reader.tensors}
name = "output.weight" if "output.weight" in t else "token_embd.weight"
T = t[name]
W = gguf.quants.dequantize(T.data, T.tensor_type).astype(np.float32)      # [262144, 640]
L1 = np.abs(W).reshape(W.shape[0], -1, 32).sum(axis=2)                   # [V, 20]
L1row = L1.sum(axis=1)
tg = Target.load(F)
H = []
orig = D.Decoder._head
def hooked(self, h):
    H.append(h.detach().clone().numpy()); return orig(self, h)
D.Decoder._head = hooked
qs = [json.loads(l) for l in open("/work/shared/data/spec_bench/question.jsonl")][::40][:6]
dec = tg.decoder
with torch.inference_mode():
    for q in qs:
        ids = tg.tokenizer(q["turns"][0])["input_ids"][-300:]
        c = dec.new_cache(); lg = dec.forward(c, ids, True)
        for i in range(40):
            tok = int(lg[-1].argmax()); lg = dec.forward(c, [tok], True)
D.Decoder._head = orig
h = np.concatenate([x.reshape(-1, x.shape[-1]) for x in H])
print("positions", h.shape)
c1, c2, bs = [], [], []
for row in h[1::1]:
    xb = row.reshape(-1, 32)
    dx = np.abs(xb).max(axis=1) / 127.0
    xq = np.round(xb / np.where(dx > 0, dx, 1)[:, None]) * dx[:, None]
    exact = W @ row
    approx = W @ xq.reshape(-1)
    e = dx / 2
    bound = L1 @ e * 1.01 + 1e-4
    bound2 = L1row * e.max() * 1.01 + 1e-4
    assert np.all(np.abs(exact - approx) <= bound)
    top = approx.argmax()
    for b, cc in ((bound, c1), (bound2, c2)):
        lo = (approx - b).max()
        cand = np.nonzero(approx + b >= lo)[0]
        assert int(exact.argmax()) in set(cand.tolist())
        cc.append(len(cand))
    bs.append(float(np.median(bound)))
for nm, cc in (("per-block", c1), ("per-row", c2)):
    cc = np.array(cc); print(nm, "candidates: median", np.median(cc), "p90", np.quantile(cc, 0.9), "max", cc.max())
print("median bound", np.median(bs))
