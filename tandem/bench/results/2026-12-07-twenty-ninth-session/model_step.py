"""ms per drafted token, 1 thread, blocks of 2 continuing a growing context (as a followed node drafts them),
for the shipped ONNX drafter and the target's own file (int8), beside the target's plain fp32 step; alternated."""
import os, sys, time, statistics as st
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.getcwd())
import torch
from drafter_service.factory import load_drafter
from tandem.defaults import resolve_drafter
from tandem.models import resolve
from tandem.types import SamplingParams
from verifier_service import torch_thread
from verifier_service.target import Target

loc = resolve("default"); path = loc.directory / loc.gguf_file
onnx = load_drafter(resolve_drafter("default"), threads=1)
gguf = load_drafter(path, threads=1)
torch_thread.run(torch.set_num_threads, 1)
target = Target.load(str(path))
prompt = list(range(200, 400))
res = {"onnx": [], "gguf": [], "target": []}

def drafting(d, name, n=64):
    ctx, known, out = list(prompt), 0, []
    for i in range(n // 2):
        t0 = time.perf_counter()
        p = d.propose(name, known, ctx[known:], 2, SamplingParams())
        out.append((time.perf_counter() - t0) * 1e3 / 2)
        known = len(ctx); ctx += [t.token_id for t in p.tokens]
    d.end_session(name)
    return out

def target_steps(n=32):
    dec = target.decoder
    def run():
        c = dec.new_cache(); lg = dec.forward(c, prompt, True); out = []
        for i in range(n):
            t0 = time.perf_counter(); lg = dec.forward(c, [int(lg[-1].argmax())], False); out.append((time.perf_counter() - t0) * 1e3)
        return out
    return torch_thread.run(run)

for rep in range(5):
    res["onnx"] += drafting(onnx, f"o{rep}")
    res["gguf"] += drafting(gguf, f"g{rep}")
    res["target"] += target_steps()
for k, v in res.items():
    print(f"{k:7s} ms per token: median {st.median(v):.2f}  min {min(v):.2f}")
