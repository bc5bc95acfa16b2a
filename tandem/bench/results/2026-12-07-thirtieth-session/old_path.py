"""After an int8/fp32 disagreement at position j: does the int8 path drafted after its own token d_j
continue the same after the target's token r? (guesses for the new path from the dropped one)"""
import os, sys
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.getcwd())
import torch
torch.set_num_threads(2)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import fp32_greedy, greedy, load
path, n, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t32, seqs = fp32_greedy(path, n, T)
t8 = load(path, "int8"); dec = t8.decoder
L = 6
same = [0] * L; events = 0
with torch.inference_mode():
    for ids, out in seqs:
        c = dec.new_cache(); lp = dec.forward(c, ids, True); lg = dec.forward(c, out[:-1], False)
        pred = [int(lp[-1].argmax())] + [int(x.argmax()) for x in lg]
        for j, (p, o) in enumerate(zip(pred, out)):
            if p != o and j < len(out) - L:
                ctx = ids + out[:j]
                old = greedy(dec, ctx + [p], L); new = greedy(dec, ctx + [o], L)
                events += 1
                run = 0
                while run < L and old[run] == new[run]: run += 1
                for r in range(run): same[r] += 1
print(f"{events} disagreements; the old path's next tokens equal the new path's: " +
      ", ".join(f"first {i+1}: {same[i]/events:.2f}" for i in range(L)))
