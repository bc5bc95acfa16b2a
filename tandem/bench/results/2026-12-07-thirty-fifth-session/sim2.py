import json, sys, collections
sys.path.insert(0, "/work/main")
from drafter_service.guesses import Continuations
import numpy as np
COST = {1: 5.8, 2: 7.0, 3: 9.9, 4: 11.5, 5: 13.5, 6: 14.2, 7: 15.3, 8: 17.2, 9: 18.7, 10: 20.1, 11: 21.5, 12: 23.0, 13: 25, 14: 27, 15: 29, 16: 30.8}
paths = json.load(open(sys.argv[1]))
def match_len(seq, cont, maxl=64):
    # longest n such that seq[-n:] occurred earlier, ending at e, where cont guess came from: recompute simply
    size = len(seq)
    best_e, best = None, 0
    return None
def sim(m_of):
    fw = ms = toks = 0
    for p in paths:
        cont = Continuations(); seq = list(p["prompt"]); path = p["path"]
        seq.append(path[0]); i = 1
        while i < len(path):
            g = cont.guess(seq, 16)
            L = 0
            if g:
                # where the guess came from: find the end e with seq[e:e+len] == g and longest suffix match
                # (recompute: most recent occurrence of last-3..1 gram, as Continuations does)
                size = len(seq)
                for n in range(min(3, size - 1), 0, -1):
                    key = seq[size - n:]
                    ends = [e for e in range(n, size) if seq[e - n:e] == key]
                    if ends:
                        e = ends[-1]
                        L = 0
                        while L < 64 and e - L - 1 >= 0 and seq[e - L - 1] == seq[size - L - 1]:
                            L += 1
                        break
            m = max(1, min(len(g), m_of(L))) if g else 0
            g = g[:m]
            fw += 1; ms += COST[1 + len(g)]
            k = 0
            while True:
                nxt = path[i]
                seq.append(nxt); i += 1; toks += 1
                if i >= len(path) or k >= len(g) or g[k] != nxt: break
                k += 1
    return toks / fw, ms / toks
pols = {"m=1 (current)": lambda L: 1}
for T in (6, 8, 12):
    for G in (11, 15):
        pols[f"L>={T}: {G}"] = (lambda T, G: lambda L: G if L >= T else 1)(T, G)
pols["L/2 up to 11"] = lambda L: max(1, min(11, L // 2))
pols["L-4 up to 15"] = lambda L: max(1, min(15, L - 4))
pols["L-4 up to 7"] = lambda L: max(1, min(7, L - 4))
for T in ():
    for G in ():
        pols[f"L>={T}: {G}"] = (lambda T, G: lambda L: G if L >= T else 1)(T, G)
pols["L/2 up to 7"] = lambda L: max(1, min(7, L // 2))
pols["L/4 up to 7"] = lambda L: max(1, min(7, L // 4))
pols["L/2 up to 15"] = lambda L: max(1, min(15, L // 2))
for pn, pol in pols.items():
    tpf, mpt = sim(pol); print(f"{pn:18s} tokens/forward {tpf:.3f}  ms/token {mpt:.2f}", flush=True)
