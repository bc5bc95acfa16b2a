"""Plain steps two ways in one process, alternated: Target.averify (the verifier's path) and decoder.forward
(forward_costs' path) on the torch thread. Median ms over 64 steps x rounds."""
import asyncio, os, sys, time, statistics as st
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.getcwd())   # the tree to time: run from its root
import torch
from verifier_service import torch_thread
from verifier_service.target import Target
from tandem.types import SamplingParams

async def main():
    torch_thread.run(torch.set_num_threads, 2)
    target = await torch_thread.arun(Target.load, sys.argv[1])
    ids = target.tokenizer("Explain how a hash map works, in detail.")["input_ids"]
    dec = target.decoder
    def direct(n):
        c = dec.new_cache()
        with torch.inference_mode():
            dec.forward(c, ids, True)
            out = []
            tok = 5
            for i in range(n):
                t0 = time.perf_counter()
                lg = dec.forward(c, [tok], False)
                tok = int(lg[-1].argmax())
                out.append((time.perf_counter() - t0) * 1e3)
        return out
    res = {"averify wall": [], "averify forward": [], "direct": []}
    for rep in range(4):
        await target.astart("s%d" % rep, ids, SamplingParams())
        for i in range(64):
            t0 = time.perf_counter()
            o = await target.averify("s%d" % rep, [])
            res["averify wall"].append((time.perf_counter() - t0) * 1e3); res["averify forward"].append(o.forward_ms)
        target.end("s%d" % rep)
        res["direct"] += await torch_thread.arun(direct, 64)
    for k, v in res.items():
        print(f"{k:16s} median {st.median(v):.2f} ms  min {min(v):.2f}", flush=True)
asyncio.run(main())
