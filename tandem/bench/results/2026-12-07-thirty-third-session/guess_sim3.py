import json, sys, collections
sys.path.insert(0, "/work/main")
from drafter_service.guesses import Continuations
exec(open("/tmp/b33/guess_sim.py").read().split("W1, W2")[0])
firsts = {}
for p in paths: firsts.setdefault(p["category"], p)
b13 = list(firsts.values())
def sim(order, N, seeded, minc=1):
    tabs = [collections.defaultdict(collections.Counter) for _ in range(N + 1)]
    def learn(seq_tail, nxt):
        for n in range(1, N + 1):
            if len(seq_tail) >= n: tabs[n][tuple(seq_tail[-n:])][nxt] += 1
    if seeded:
        for r in rows:
            s = r["output_ids"]
            for i in range(1, len(s)): learn(s[max(0, i - N):i], s[i])
    def pred(seq):
        for n in range(N, 0, -1):
            c = tabs[n].get(tuple(seq[-n:]))
            if c:
                t, k = c.most_common(1)[0]
                if k >= minc or n == 1: return t
        return None
    fw = ms = toks = 0
    for p in order:
        cont = Continuations(); seq = list(p["prompt"]); path = p["path"]
        seq.append(path[0]); i = 1
        while i < len(path):
            g = cont.guess(seq, 1); g = g[0] if g else pred(seq)
            fw += 1; ms += 5.3 if g is not None else 4.9
            nxt = path[i]; learn(seq, nxt); seq.append(nxt); i += 1; toks += 1
            if g is not None and g == nxt and i < len(path):
                nxt = path[i]; learn(seq, nxt); seq.append(nxt); i += 1; toks += 1
    return toks / fw, ms / toks
for name, order in (("13 prompts", b13), ("all 65", paths)):
    for N in (1, 2, 3, 4):
        for seeded in (False, True):
            tpf, mpt = sim(order, N, seeded); print(f"{name:11s} N={N} seeded={seeded!s:5} tokens/forward {tpf:.3f} ms/token {mpt:.2f}")
