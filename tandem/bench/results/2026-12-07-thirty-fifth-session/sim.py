"""Offline: the .gguf node's guessed rows over its own greedy paths (node_paths.py's JSON), by how many tokens
it guesses as a function of the match length L the guess stands on (Continuations.guess_matched, L capped at
64). Prints tokens a forward and ms a drafted token under the int8 step's costs by width (1 thread, ctx 600).

    python sim.py /tmp/b35/paths-1024.json
"""
import json, sys
sys.path.insert(0, "/work/main")
from drafter_service.guesses import Continuations
COST = {1: 5.8, 2: 7.0, 3: 9.9, 4: 11.5, 5: 13.5, 6: 14.2, 7: 15.3, 8: 17.2, 9: 18.7, 10: 20.1, 11: 21.5, 12: 23.0, 13: 25, 14: 27, 15: 29, 16: 30.8}
paths = json.load(open(sys.argv[1]))
def sim(m_of):
    fw = ms = toks = 0
    for p in paths:
        cont = Continuations(); seq = list(p["prompt"]); path = p["path"]
        seq.append(path[0]); i = 1
        while i < len(path):
            g, L = cont.guess_matched(seq, 16, longest=64)
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
for T, Gs in ((4, (3, 5, 7)), (6, (3, 5, 7, 11, 15)), (8, (3, 5, 7, 11, 15)), (12, (3, 5, 7, 11, 15)), (16, (3, 5, 7))):
    for G in Gs:
        pols[f"L>={T}: {G}"] = (lambda T, G: lambda L: G if L >= T else 1)(T, G)
for name, top, f in (("L/2", 7, lambda L: L // 2), ("L/4", 7, lambda L: L // 4), ("L/2", 11, lambda L: L // 2),
                     ("L/2", 15, lambda L: L // 2), ("L-4", 7, lambda L: L - 4), ("L-4", 15, lambda L: L - 4)):
    pols[f"{name} up to {top}"] = (lambda top, f: lambda L: max(1, min(top, f(L))))(top, f)
for pn, pol in pols.items():
    tpf, mpt = sim(pol); print(f"{pn:18s} tokens/forward {tpf:.3f}  ms/token {mpt:.2f}", flush=True)
