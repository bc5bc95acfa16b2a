"""In-process plain steps through Target.averify (the gateway's path without HTTP/gRPC): wall vs compute.

    HF_HUB_OFFLINE=1 .venv/bin/python tandem/bench/results/2026-12-06-twenty-sixth-session/inprocess_steps.py
    (TGT=FILE.gguf for another target; TANDEM_ACTIVATIONS=int8 for int8). Median ms of 128 steps, three sessions:
    wall of the await, the verifier's compute, its forward, the queue before it, and the rest (after).
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
    for rep in range(3):
        walls, comp, queue, fwd = [], [], [], []
        await target.astart("s%d" % rep, ids, SamplingParams())
        for i in range(128):
            t0 = time.perf_counter()
            out = await target.averify("s%d" % rep, [])
            walls.append((time.perf_counter() - t0) * 1e3); comp.append(out.compute_ms); queue.append(out.queue_ms); fwd.append(out.forward_ms)
        target.end("s%d" % rep)
        m = st.median
        print(f"wall {m(walls):.3f} compute {m(comp):.3f} forward {m(fwd):.3f} queue {m(queue):.3f} after {m(w - c - q for w, c, q in zip(walls, comp, queue)):.3f} ms")
asyncio.run(main())
