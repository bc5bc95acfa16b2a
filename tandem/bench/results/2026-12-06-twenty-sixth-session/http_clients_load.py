"""N HTTP clients (threads) streaming plain chat requests; aggregate tok/s, gateway threads' CPU a token.

    tandem up --activations int8 --no-speculation   # then:
    HF_HUB_OFFLINE=1 .venv/bin/python tandem/bench/results/2026-12-06-twenty-sixth-session/http_clients_load.py 1,4,8
    (REQ requests a client, MT tokens a request; CPU of each gateway thread from /proc).
"""
import os, sys, time, json, subprocess, threading
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
from tandem.bench.http_stream import chat_body, stream_chat, one_off
pid = int(subprocess.check_output(["pgrep", "-f", "serve-gateway"]).split()[0]); tick = os.sysconf("SC_CLK_TCK")
def threads():
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try: f = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError: continue
        out[tid] = (int(f[11]) + int(f[12])) / tick
    return out
prompts = ["Explain how a hash map works.", "Write a short story about a lighthouse keeper.",
           "List five uses of a paperclip.", "What causes the seasons on Earth?", "Describe the water cycle.",
           "Give three tips for learning a new language.", "What is a binary search?", "Summarize the plot of Hamlet."]
MT = int(os.environ.get("MT", 96))
def client(i, n, toks):
    for j in range(n):
        s = stream_chat("http://127.0.0.1:8080", chat_body(prompts[(i + j) % len(prompts)], MT, extra={**one_off(), "ignore_eos": True}))
        toks[i] += s.get("tokens") or MT
stream_chat("http://127.0.0.1:8080", chat_body("Hi", 8, extra=one_off()))
for n in [int(x) for x in sys.argv[1].split(",")]:
    toks = [0] * n
    a = threads(); c0 = time.process_time(); t0 = time.perf_counter()
    ts = [threading.Thread(target=client, args=(i, int(os.environ.get("REQ", 3)), toks)) for i in range(n)]
    [t.start() for t in ts]; [t.join() for t in ts]
    wall = time.perf_counter() - t0; c1 = time.process_time(); b = threads(); T = sum(toks)
    cpu = sorted(((b[t] - a.get(t, 0)) * 1e3 / T for t in b), reverse=True)
    print(f"{n} clients: {T / wall:.1f} tok/s; CPU ms a token: client {1e3 * (c1 - c0) / T:.3f}, gateway threads {' '.join(f'{c:.3f}' for c in cpu if c > 0.005)}", flush=True)
