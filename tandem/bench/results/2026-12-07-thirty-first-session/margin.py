"""Premise check: fp32 greedy outputs vs the int8 decoder's teacher-forced argmax at each position.
Usage: python int8_agree.py FILE N_PROMPTS TOKENS"""
import os, sys, json, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.getcwd())
import torch
torch.set_num_threads(2)
from verifier_service.target import Target
path, n, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
qs = [json.loads(l) for l in open("/work/shared/data/spec_bench/question.jsonl")]
qs = qs[::max(1, len(qs)//n)][:n]
os.environ["TANDEM_ACTIVATIONS"] = "fp32"
t32 = Target.load(path)
tok = t32.tokenizer
seqs = []
with torch.inference_mode():
    for q in qs:
        text = q["turns"][0]
        try:
            ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
            if hasattr(ids, "keys"): ids = ids["input_ids"]
        except Exception:
            ids = tok(text)["input_ids"]
        ids = list(ids)[-400:]
        dec = t32.decoder; c = dec.new_cache()
        lg = dec.forward(c, ids, True); out = []
        for i in range(T):
            t = int(lg[-1].argmax()); out.append(t)
            lg = dec.forward(c, [t], False)
        seqs.append((ids, out))
del t32
os.environ["TANDEM_ACTIVATIONS"] = "int8"
t8 = Target.load(path)
agree = total = 0; firsts = []; runs = []
with torch.inference_mode():
    for ids, out in seqs:
        dec = t8.decoder; c = dec.new_cache()
        lg_p = dec.forward(c, ids, True)
        lg = dec.forward(c, out[:-1], False)
        pred = [int(lg_p[-1].argmax())] + [int(r.argmax()) for r in lg]
        m = [int(a == b) for a, b in zip(pred, out)]
        agree += sum(m); total += len(m)
        # run length of agreement from each position
        run = 0
        for x in m:
            if x: run += 1
            else: runs.append(run); run = 0
        runs.append(run)

# margins: int8 top1 - top2 logit, at agreeing and disagreeing positions; where they disagree, the target's rank
import numpy as np
M_agree, M_dis, ranks = [], [], []
with torch.inference_mode():
    for ids, out in seqs:
        dec = t8.decoder; c = dec.new_cache()
        lg_p = dec.forward(c, ids, True)
        lg = dec.forward(c, out[:-1], False)
        rows = torch.cat([lg_p[-1:], lg])
        top = rows.topk(2, dim=-1)
        for r, t, (v, i) in zip(rows, out, zip(top.values, top.indices)):
            m = float(v[0] - v[1])
            if int(i[0]) == t: M_agree.append(m)
            else:
                M_dis.append(m); ranks.append(int((r > r[t]).sum()))
M_agree, M_dis = np.array(M_agree), np.array(M_dis)
print(f"positions {len(M_agree)+len(M_dis)}, disagree {len(M_dis)}; target = int8's 2nd choice at {np.mean(np.array(ranks)==1):.2f} of them")
print("int8 margin quantiles, disagreeing:", np.quantile(M_dis, [0.5, 0.9, 0.99]).round(3))
for th in (0.05, 0.1, 0.2, 0.3, 0.5, 1.0):
    flagged = (M_agree < th).sum() + (M_dis < th).sum()
    print(f"margin < {th}: flags {flagged} positions ({flagged/(len(M_agree)+len(M_dis)):.3f}), catching {(M_dis < th).mean():.2f} of disagreements")
