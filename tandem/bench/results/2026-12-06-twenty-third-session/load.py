"""N streaming OpenAI chat clients x M requests against a running tandem up; prints aggregate tok/s."""
import sys, time, threading, json, os
import httpx
n, m, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 8080
topics = ["rivers", "bread", "chess", "volcanoes", "bicycles", "owls", "tea", "glass", "clocks", "maps",
          "bees", "snow", "ships", "paper", "salt", "bridges"]
lock = threading.Lock(); tokens = [0]; gaps = []
def client(i):
    with httpx.Client(timeout=120) as c:
        for j in range(m):
            t = topics[(i * m + j) % len(topics)]
            body = {"model": "tandem", "messages": [{"role": "user", "content": f"Write a short paragraph about {t}."}],
                    "max_tokens": 96, "stream": True, "temperature": 0}
            last = None; got = 0
            with c.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        d = json.loads(line[6:])
                        if d.get("choices") and d["choices"][0]["delta"].get("content"):
                            now = time.perf_counter(); got += 1
                            if last is not None:
                                with lock: gaps.append(now - last)
                            last = now
                        u = d.get("usage")
                        if u: ct = u["completion_tokens"]
            with lock: tokens[0] += ct if 'ct' in dir() else got
t0 = time.perf_counter()
th = [threading.Thread(target=client, args=(i,)) for i in range(n)]
[t.start() for t in th]; [t.join() for t in th]
dt = time.perf_counter() - t0
gaps.sort()
p = lambda q: 1000 * gaps[int(q * (len(gaps) - 1))] if gaps else 0
print(json.dumps({"clients": n, "tok_s": round(tokens[0] / dt, 1), "tokens": tokens[0], "s": round(dt, 2),
                  "itl_p50": round(p(.5), 2), "itl_p95": round(p(.95), 2)}))
