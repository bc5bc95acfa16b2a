import json, sys
from transformers import AutoTokenizer
from drafter_service.suffix import SuffixIndex
import drafter_service.suffix as S
from tandem.bench.workload import repeated_traffic
tok = AutoTokenizer.from_pretrained("drafters/smollm2-135m-instruct")
d = json.load(open(sys.argv[1]))
convs = {c.name: c for c in repeated_traffic()}
def ctxs(passno):
    out = []
    hist = {}
    for s in d['samples']:
        if s['mode'] != 'speculative' or s['pass'] != passno: continue
        c = convs[s['conversation']]
        h = hist.setdefault(c.name, [{"role": "system", "content": c.system}] if c.system else [])
        h.append({"role": "user", "content": c.turns[s['turn']]})
        p = tok.apply_chat_template(h, add_generation_prompt=True, tokenize=False)
        pid = tok(p, add_special_tokens=False)["input_ids"]
        oid = tok(s['text'], add_special_tokens=False)["input_ids"]
        h.append({"role": "assistant", "content": s['text']})
        out.append((s['conversation'], s['turn'], pid, oid))
    return out
kw = {}
if len(sys.argv) > 2: kw = eval(sys.argv[2])
idx = SuffixIndex(**kw)
for name, t, p, o in ctxs(1):
    idx.add(p + o)
K = 8
for name, t, p, o in ctxs(2):
    seq = idx.open(); idx.extend(seq, p)
    pos, rounds, acc = 0, 0, 0
    while pos < len(o):
        ctx = p + o[:pos]
        dr = idx.propose(ctx, K, own=seq)
        n = 0
        for a, b in zip(dr.tokens, o[pos:]):
            if a != b: break
            n += 1
        rounds += 1; acc += n
        step = n + 1
        idx.extend(seq, o[pos:pos+step]); pos += step
    idx.release(seq)
    print(name, t, len(p), len(o), "rounds", rounds, "tau", round(len(o)/rounds, 2))
