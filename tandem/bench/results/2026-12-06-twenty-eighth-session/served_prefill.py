"""Served prefill against a running `tandem up` (HTTP port PORT): eight Spec-Bench summarization and rag
prompts (new to the prefix cache), two tokens each; the verifier's prefill ms and tok/s.

    python served_prefill.py PORT
"""
import httpx, sys, time, json
port = int(sys.argv[1])
url = f"http://127.0.0.1:{port}/v1/chat/completions"
end = time.time() + 600
while time.time() < end:
    try:
        if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200: break
    except Exception: pass
    time.sleep(1)
qs = [json.loads(l) for l in open("/work/shared/data/spec_bench/question.jsonl")]
longs = [q["turns"][0] for q in qs if q.get("category") in ("summarization", "rag")][3:11]
for p in longs:
    b = {"model": "x", "messages": [{"role": "user", "content": p}], "max_tokens": 2, "ignore_eos": True,
         "no_speculation": True, "stream": False}
    r = httpx.post(url, json=b, timeout=300).json()
    t = r["tandem"]; n = r['usage']['prompt_tokens']
    print(f"prompt {n:4d} prefill {t['prefill_ms']:7.1f} ms = {n / t['prefill_ms'] * 1e3:5.0f} tok/s", flush=True)
