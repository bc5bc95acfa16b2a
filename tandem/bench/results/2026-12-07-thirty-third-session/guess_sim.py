import json, sys, collections
sys.path.insert(0, "/work/main")
from drafter_service.guesses import Continuations
paths = json.load(open("/tmp/b33/paths.json"))
rows = [json.loads(l) for l in open('/work/shared/data/distill/smollm2_135m_instruct_samples.jsonl')]
def table_from(seqs):
    t = collections.defaultdict(collections.Counter)
    for s in seqs:
        for a, b in zip(s, s[1:]): t[a][b] += 1
    return t
static = table_from([r["output_ids"] for r in rows])
W1, W2 = 4.9, 5.3
def sim(order, habits_mode):
    habits = collections.defaultdict(collections.Counter)
    if habits_mode == "static+online":
        for a, c in static.items(): habits[a].update(c)
    fw = ms = toks = 0
    for p in order:
        cont = Continuations(); seq = list(p["prompt"]); path = p["path"]
        i = 0
        # seq holds prompt + path[:i]; the next forward feeds path[i] (drafted) + guess
        seq.append(path[0]); i = 1
        while i < len(path):
            g = cont.guess(seq, 1)
            g = g[0] if g else None
            if g is None and habits_mode != "none":
                c = habits.get(seq[-1])
                g = c.most_common(1)[0][0] if c else None
            fw += 1; ms += W2 if g is not None else W1
            # the forward's first row gives path[i]
            nxt = path[i]
            if habits_mode != "none": habits[seq[-1]][nxt] += 1
            seq.append(nxt); i += 1; toks += 1
            if g is not None and g == nxt and i < len(path):   # the guess row gives path[i] too: no forward for it
                nxt2 = path[i]
                if habits_mode != "none": habits[seq[-1]][nxt2] += 1
                seq.append(nxt2); i += 1; toks += 1
    return toks / fw, ms / toks
bench13 = [p for p in paths if p["qid"] in {q for q in set()}] 
firsts = {}
for p in paths: firsts.setdefault(p["category"], p)
b13 = list(firsts.values())
for name, order in (("13 prompts (one a category)", b13), ("all 65", paths)):
    for mode in ("none", "online", "static+online"):
        tpf, mpt = sim(order, mode); print(f"{name:28s} {mode:14s} tokens/forward {tpf:.3f}  ms/token {mpt:.2f}")
