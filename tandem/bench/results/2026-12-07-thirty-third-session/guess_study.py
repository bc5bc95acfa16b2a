import json, sys, collections
sys.path.insert(0, "/work/main")
from drafter_service.guesses import Continuations
paths = json.load(open("/tmp/b33/paths.json"))
rows = [json.loads(l) for l in open('/work/shared/data/distill/smollm2_135m_instruct_samples.jsonl')]
# static tables from the target's sampled outputs (train split): bigram and trigram -> Counter
big = collections.defaultdict(collections.Counter); tri = collections.defaultdict(collections.Counter)
for r in rows:
    s = r['prompt_ids'][-3:] + r['output_ids']
    for i in range(2, len(s)):
        big[s[i-1]][s[i]] += 1
        tri[(s[i-2], s[i-1])][s[i]] += 1
big1 = {a: c.most_common(1)[0][0] for a, c in big.items()}
tri1 = {a: c.most_common(1)[0] for a, c in tri.items()}
def run(policy):
    hit = avail = n = 0
    for p in paths:
        cont = Continuations()
        seq = list(p["prompt"])
        for i, t in enumerate(p["path"][:-1]):
            seq.append(t)
            g = policy(cont, seq)
            n += 1
            if g is not None:
                avail += 1
                hit += g == p["path"][i + 1]
    return hit / n, avail / n
def cur(cont, seq):
    g = cont.guess(seq, 1); return g[0] if g else None
def ngram2(cont, seq):   # Continuations but only matches of n>=2, else None
    g = cont.guess(seq, 1)
    return g[0] if g else None
def static_big(cont, seq): return big1.get(seq[-1])
def cur_then_big(cont, seq):
    g = cont.guess(seq, 1); return g[0] if g else big1.get(seq[-1])
def tri_then_cur_then_big(cont, seq):
    t = tri1.get((seq[-2], seq[-1]))
    g = cont.guess(seq, 1)
    if t and t[1] >= 3: return t[0]
    return g[0] if g else big1.get(seq[-1])
for name, pol in [("current", cur), ("static bigram", static_big), ("current, else bigram", cur_then_big),
                  ("trigram(>=3), else current, else bigram", tri_then_cur_then_big)]:
    h, a = run(pol); print(f"{name:45s} hit {h:.3f} available {a:.3f}")

def match(seq, maxn=4):
    """(n, guess) of the longest n-gram ending at seq's end with an earlier occurrence (most recent)."""
    L = len(seq)
    for n in range(min(maxn, L - 1), 0, -1):
        key = seq[L - n:]
        for e in range(L - 1, n - 1, -1):     # e: end of an earlier occurrence (exclusive), e < L
            if seq[e - n:e] == key:
                return n, seq[e]
    return 0, None
stats = collections.defaultdict(lambda: [0, 0, 0])   # n -> [count, hit ngram, hit bigram]
for p in paths:
    seq = list(p["prompt"])
    for i, t in enumerate(p["path"][:-1]):
        seq.append(t)
        n, g = match(seq)
        b = big1.get(t)
        s = stats[n]; s[0] += 1; s[1] += g == p["path"][i + 1]; s[2] += b == p["path"][i + 1]
tot = sum(s[0] for s in stats.values())
for n in sorted(stats):
    c, h, b = stats[n]; print(f"n={n}: {c/tot:.3f} of positions, ngram hit {h/c:.3f}, bigram hit {b/c:.3f}")
best = sum(max(s[1], s[2]) for s in stats.values()) / tot
print("best per n:", best)

def online(order_paths, seed=None, use_static=False):
    tab = collections.defaultdict(collections.Counter)
    hit = n = 0
    for p in order_paths:
        seq = list(p["prompt"])
        for a, b in zip(seq, seq[1:]): pass
        for i, t in enumerate(p["path"][:-1]):
            seq.append(t)
            m, g = match(seq)
            if m == 0:
                c = tab.get(t)
                g = c.most_common(1)[0][0] if c else (big1.get(t) if use_static else None)
            n += 1; hit += g == p["path"][i + 1]
            tab[t][p["path"][i + 1]] += 1          # learns the drafted token that followed
    return hit / n
import random
order = list(paths); random.Random(1).shuffle(order)
print("online bigram (own drafts, shuffled order):", round(online(order), 3), " + static fallback:", round(online(order, use_static=True), 3))
print("first 13 prompts only, online:", round(online(order[:13]), 3))
