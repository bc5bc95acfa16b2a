"""N sessions doing plain steps concurrently through Target.averify in one event loop: aggregate steps/s vs forwards.

    HF_HUB_OFFLINE=1 .venv/bin/python tandem/bench/results/2026-12-06-twenty-sixth-session/inprocess_sessions.py 1,4,8
    (each level twice; TANDEM_ACTIVATIONS=int8 for int8).
"""
import asyncio, os, sys, time, statistics as st
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from verifier_service import torch_thread
from verifier_service.target import Target
from tandem.types import SamplingParams

async def main():
    torch_thread.run(torch.set_num_threads, 2)
    target = await torch_thread.arun(Target.load, os.environ.get("TGT", "default"))
    ids = target.tokenizer("Explain how a hash map works, in detail.")["input_ids"]
    forwards = []
    target.scheduler.add_listener(lambda f: forwards.append(f))
    keep = forwards  # noqa
    for n in [int(x) for x in sys.argv[1].split(",")] * 2:
        sids = [f"s{n}-{i}-{time.time()}" for i in range(n)]
        for s in sids:
            await target.astart(s, ids, SamplingParams())
        forwards.clear()
        steps = 96
        outs = []
        async def one(s):
            for _ in range(steps):
                o = await target.averify(s, [])
                outs.append(o)
        t0 = time.perf_counter()
        await asyncio.gather(*(one(s) for s in sids))
        wall = time.perf_counter() - t0
        vf = [f for f in forwards if f.kind == "verify"]
        fms = sum(f.ms for f in vf)
        print(f"{n} sessions: {n*steps/wall:.1f} steps/s, {len(vf)} forwards, {sum(f.rows for f in vf)/len(vf):.2f} rows a forward, "
              f"forward {fms/len(vf):.2f} ms, wall a forward {wall*1e3/len(vf):.2f} ms -> gap {(wall*1e3-fms)/len(vf):.2f} ms; outcome forward {st.mean(o.forward_ms for o in outs):.2f} compute {st.mean(o.compute_ms for o in outs):.2f}")
        for s in sids:
            target.end(s)
asyncio.run(main())
