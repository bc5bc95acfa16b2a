"""Served plain decoding against a running `tandem up` (HTTP port PORT): each prompt streamed and then
not streamed, alternated; the verifier's ms a round (the gateway's stats), the rest of the round, tok/s.

    tandem up --target FILE --drafter suffix --verifier-threads 2 --http-port PORT &
    python served_plain.py PORT N_PROMPTS MAX_TOKENS
"""
import json, sys, time, statistics as st
import httpx

port, n, max_tokens = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
url = f"http://127.0.0.1:{port}/v1/chat/completions"
qs = [json.loads(l) for l in open("/work/shared/data/spec_bench/question.jsonl")]
prompts = [q["turns"][0] for q in qs if len(q["turns"][0]) < 400][:n]
end = time.time() + 600
while time.time() < end:
    try:
        if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
            break
    except Exception:
        pass
    time.sleep(1)

def body(p, stream):
    return {"model": "x", "messages": [{"role": "user", "content": p}], "max_tokens": max_tokens,
            "ignore_eos": True, "no_speculation": True, "stream": stream}

def run(p, stream):
    t0 = time.perf_counter()
    if stream:
        last = None
        with httpx.stream("POST", url, json=body(p, True), timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    obj = json.loads(line[6:])
                    if obj.get("tandem", {}).get("verify_ms") is not None:
                        last = obj["tandem"]
        t = last
    else:
        t = httpx.post(url, json=body(p, False), timeout=300).json()["tandem"]
    wall = time.perf_counter() - t0
    return t["verify_ms"] / max(1, t["rounds"]), t["overhead_ms"] / max(1, t["rounds"]), t["new_tokens"] / wall, t["rounds"]

run(prompts[0], False)
res = {True: [], False: []}
for p in prompts:
    for s in (True, False):
        res[s].append(run(p, s))
for s in (True, False):
    v = [r[0] for r in res[s]]; o = [r[1] for r in res[s]]; tps = [r[2] for r in res[s]]
    print(f"{'streamed' if s else 'whole   '}: verify/round median {st.median(v):.2f} ms [{min(v):.2f}-{max(v):.2f}]  overhead/round {st.median(o):.2f}  tok/s {st.median(tps):.1f}", flush=True)
