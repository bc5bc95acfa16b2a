"""In-process A/B: Gemma with fp32-scale copies of every legacy kind (A) against copies of none, Q8_0/Q5_0
read from the file's blocks (B): plain steps alternated in blocks of 32, forward ms medians."""
import asyncio, os, sys, time, statistics as st
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from verifier_service import torch_thread, quant
from verifier_service.target import Target
from tandem.types import SamplingParams
G = os.environ.get("TGT", "/root/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf")
NONE = tuple(os.environ.get("B_KINDS", "").split())
async def main():
    torch_thread.run(torch.set_num_threads, 2)
    A = await torch_thread.arun(Target.load, G)
    quant.SCALED_KINDS = NONE
    B = await torch_thread.arun(Target.load, G)
    ids = A.tokenizer("Write a short story about a lighthouse keeper who finds a message in a bottle.")["input_ids"]
    res = {"A": [], "B": []}
    outs = {"A": [], "B": []}
    for rnd in range(int(os.environ.get("ROUNDS", "12"))):
        for name, t in (("A", A), ("B", B)) if rnd % 2 == 0 else (("B", B), ("A", A)):
            await t.astart("s", ids, SamplingParams())
            for i in range(32):
                out = await t.averify("s", [])
                res[name].append(out.forward_ms)
            t.end("s")
    for k in res:
        print(k, "forward median %.3f  p25 %.3f  min %.3f ms" % (st.median(res[k]), st.quantiles(res[k], n=4)[0], min(res[k])))
asyncio.run(main())
