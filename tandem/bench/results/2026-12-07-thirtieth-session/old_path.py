"""After an int8/fp32 disagreement at position j: does the int8 path drafted after its own token d_j
continue the same after the target's token r? (guesses for the new path from the dropped one)"""
import os, sys, json
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.getcwd())
import torch
torch.set_num_threads(2)
from verifier_service.target import Target
path, n, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
qs = [json.loads(l) for l in open("/work/shared/data/spec_bench/question.jsonl")]
qs = qs[::max(1, len(qs)//n)][:n]
os.environ["TANDEM_ACTIVATIONS"] = "fp32"
t32 = Target.load(path); tok = t32.tokenizer
seqs = []
with torch.inference_mode():
    for q in qs:
        ids = tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True)
        if hasattr(ids, "keys"): ids = ids["input_ids"]
        ids = list(ids)[-400:]
        dec = t32.decoder; c = dec.new_cache(); lg = dec.forward(c, ids, True); out = []
        for i in range(T):
            t = int(lg[-1].argmax()); out.append(t); lg = dec.forward(c, [t], False)
        seqs.append((ids, out))
os.environ["TANDEM_ACTIVATIONS"] = "int8"
t8 = Target.load(path); dec = t8.decoder
def greedy(ctx, n):
    c = dec.new_cache(); lg = dec.forward(c, ctx, True); out = []
    for i in range(n):
        t = int(lg[-1].argmax()); out.append(t); lg = dec.forward(c, [t], False)
    return out
L = 6
same = [0] * L; events = 0
with torch.inference_mode():
    for ids, out in seqs:
        c = dec.new_cache(); lp = dec.forward(c, ids, True); lg = dec.forward(c, out[:-1], False)
        pred = [int(lp[-1].argmax())] + [int(x.argmax()) for x in lg]
        for j, (p, o) in enumerate(zip(pred, out)):
            if p != o and j < len(out) - L:
                ctx = ids + out[:j]
                old = greedy(ctx + [p], L); new = greedy(ctx + [o], L)
                events += 1
                run = 0
                while run < L and old[run] == new[run]: run += 1
                for r in range(run): same[r] += 1
print(f"{events} disagreements; the old path's next tokens equal the new path's: " +
      ", ".join(f"first {i+1}: {same[i]/events:.2f}" for i in range(L)))
