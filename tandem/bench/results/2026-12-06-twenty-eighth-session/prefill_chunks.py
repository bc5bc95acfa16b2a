"""Prefill of 512 tokens in chunks of the given row counts through the verifier's decoder, 2 threads, on the
main thread and on the torch thread (the verifier's), each repeat in turn; then the best torch-thread tok/s
per chunk. Run from the tree to time (it imports that tree's kernels):

    python prefill_chunks.py FILE.gguf                       # chunks 512 256 128 32, 2 repeats
    python prefill_chunks.py default 32 --repeats 4          # the served path's 32-row exact chunks

(results.txt's "chunk32.py" lines came from an earlier copy of the second use that timed the torch thread
only.)
"""
import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from verifier_service import torch_thread  # noqa: E402
from verifier_service.target import Target  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("target")
p.add_argument("chunks", nargs="*", type=int, default=[512, 256, 128, 32])
p.add_argument("--repeats", type=int, default=2)
args = p.parse_args()
torch.set_num_threads(2)
torch_thread.run(torch.set_num_threads, 2)
t = torch_thread.run(Target.load, args.target)
dec = t.decoder
ids = t._probe_ids(512)


def prefill(chunk):
    c = dec.new_cache()
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, 512, chunk):
            dec.forward(c, ids[i:i + chunk], True)
    return 512 / (time.perf_counter() - t0)


best = {}
for rep in range(args.repeats):
    for chunk in args.chunks:
        main = prefill(chunk)
        tt = torch_thread.run(prefill, chunk)
        best[chunk] = max(best.get(chunk, 0.0), tt)
        print(f"chunk {chunk:3d}: main thread {main:5.0f} tok/s, torch thread {tt:5.0f} tok/s", flush=True)
for chunk in args.chunks:
    print(f"chunk {chunk:3d}: best torch thread {best[chunk]:5.0f} tok/s of {args.repeats}")
