import os, sys, time, statistics as st
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.getcwd())
import torch, numpy as np
from drafter_service.gguf_drafter import GgufDrafter, DecoderKV
from tandem.models import resolve
from tandem.types import SamplingParams
from verifier_service import torch_thread
loc = resolve("default"); path = loc.directory / loc.gguf_file
g = GgufDrafter(path, threads=1)
dec = g.decoder
prompt = list(range(200, 400))
res = {"decoder.forward": [], "forward_blocks keep1": [], "drafter feed": [], "propose k=1": []}
def direct(n=32):
    out = {"decoder.forward": [], "forward_blocks keep1": []}
    with torch.inference_mode():
        c = dec.new_cache(); dec.forward(c, prompt, True); t = 5
        for i in range(n):
            t0 = time.perf_counter(); lg = dec.forward(c, [t], True); t = int(lg[-1].argmax()); out["decoder.forward"].append((time.perf_counter()-t0)*1e3)
        c = dec.new_cache(); dec.forward(c, prompt, True); t = 5
        for i in range(n):
            t0 = time.perf_counter(); lg = dec.forward_blocks([(c, [t])], [1])[0]; t = int(lg[-1].argmax()); out["forward_blocks keep1"].append((time.perf_counter()-t0)*1e3)
    return out
for rep in range(4):
    o = torch_thread.run(direct)
    for k, v in o.items(): res[k] += v
    kv = DecoderKV(g); g.feed(kv, prompt, 1); t = 5
    for i in range(32):
        t0 = time.perf_counter(); lg = g.feed(kv, [t], 1); t = int(np.argmax(lg[0, -1])); res["drafter feed"].append((time.perf_counter()-t0)*1e3)
    ctx = list(prompt); known = 0
    for i in range(32):
        t0 = time.perf_counter(); p = g.propose(f"s{rep}", known, ctx[known:], 1, SamplingParams()); res["propose k=1"].append((time.perf_counter()-t0)*1e3)
        known = len(ctx); ctx.append(p.tokens[0].token_id)
for k, v in res.items(): print(f"{k:22s} median {st.median(v):.2f} min {min(v):.2f}")
