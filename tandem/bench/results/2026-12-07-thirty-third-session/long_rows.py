"""GFLOP/s of long-row GEMMs (1 thread, min of repeats) for the kinds and widths that take the two-column or
half passes. Run from a tree's root: python long_rows.py"""
import sys, os, time
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "verifier_service", "kernels"))
import numpy as np, torch
from bench_gemm import random_weight, best_ms
torch.set_num_threads(1)
rng = np.random.default_rng(0)
shapes = {"Q4_1": (576, 1536), "Q8_0": (576, 1536), "Q5_0": (576, 1536), "F32": (576, 1536),
          "Q4_K": (640, 2048), "Q6_K": (640, 2048), "Q5_K": (640, 1024), "Q4_K1": (640, 1024), "Q6_K1": (640, 1024), "Q4_K3": (1024, 3072), "Q6_K3": (1024, 3072)}
kinds = sys.argv[1].split(",") if len(sys.argv) > 1 else list(shapes)
widths = (2, 4, 5, 6, 8, 16, 32)
print("kind  out x inner   " + "  ".join(f"w{w:<5}" for w in widths))
with torch.inference_mode():
    for kind in kinds:
        out, inner = shapes[kind]
        w = random_weight(kind[:4], out, inner, os.environ.get("ISA", "avx512"), rng)
        cells = []
        for n in widths:
            x = torch.randn(n, inner)
            t = best_ms(lambda: w.matmul(x), 25)
            cells.append(2 * n * out * inner / t / 1e6)
        print(f"{kind:<5} {out}x{inner:<7} " + "  ".join(f"{c:<6.1f}" for c in cells), flush=True)
