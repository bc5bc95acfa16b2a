import json, sys, collections
sys.path.insert(0, "/work/main")
from drafter_service.guesses import Continuations
exec(open("/tmp/b33/guess_sim.py").read().split("W1, W2")[0])
COST = {1: 4.9, 2: 5.3, 3: 6.4, 4: 7.9}
def sim(order, habits_mode, m_of):
    habits = collections.defaultdict(collections.Counter)
    if habits_mode == "static+online":
        for a, c in static.items(): habits[a].update(c)
    def hab(t):
        c = habits.get(t); return c.most_common(1)[0][0] if c else None
    fw = ms = toks = 0
    for p in order:
        cont = Continuations(); seq = list(p["prompt"]); path = p["path"]
        seq.append(path[0]); i = 1
        while i < len(path):
            g = cont.guess(seq, 3)
            src = "ngram" if g else None
            if not g and habits_mode != "none":
                h = hab(seq[-1])
                if h is not None:
                    g = [h]; src = "habit"
                    while len(g) < 3:
                        h2 = hab(g[-1])
                        if h2 is None: break
                        g.append(h2)
            m = m_of(src, len(g) if g else 0)
            g = (g or [])[:m]
            fw += 1; ms += COST[1 + len(g)]
            # tokens obtained: path[i], then each guess that matches in turn gives the next one
            k = 0
            while True:
                nxt = path[i]
                if habits_mode != "none": habits[seq[-1]][nxt] += 1
                seq.append(nxt); i += 1; toks += 1
                if i >= len(path) or k >= len(g) or g[k] != nxt: break
                k += 1
    return toks / fw, ms / toks
firsts = {}
for p in paths: firsts.setdefault(p["category"], p)
b13 = list(firsts.values())
pols = {"m=1 (current)": lambda s, n: 1, "m=2": lambda s, n: 2, "m=3": lambda s, n: 3,
        "ngram 3, habit 1": lambda s, n: 3 if s == "ngram" else 1, "ngram 2, habit 1": lambda s, n: 2 if s == "ngram" else 1}
for name, order in (("13 prompts", b13), ("all 65", paths)):
    for mode in ("none", "static+online"):
        for pn, pol in pols.items():
            tpf, mpt = sim(order, mode, pol); print(f"{name:11s} {mode:14s} {pn:18s} tokens/forward {tpf:.3f}  ms/token {mpt:.2f}")
