"""All linears of the default target, read from the fp32-scale copies against the file's own blocks, in one
process, alternated width by width (min ms of 9 calls, twice a thread count). Twenty-sixth session (e715998):

    HF_HUB_OFFLINE=1 .venv/bin/python tandem/bench/results/2026-12-06-twenty-sixth-session/ab_scaled_linears.py avx2,avx512

Each cell: copy / file's blocks (ratio)."""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "verifier_service" / "kernels"))
import bench_gemm
from verifier_service import quant
orig = quant.QuantWeight.__init__
def make(scaled):
    def init(self, *a, **k):
        k.setdefault("scaled", scaled); orig(self, *a, **k)
    quant.QuantWeight.__init__ = init
    bench_gemm.QuantWeight = quant.QuantWeight
with torch.inference_mode():
    for which in sys.argv[1].split(","):
        make(True); A = bench_gemm.default_linears(which)
        make(False); B = bench_gemm.default_linears(which)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for rep in range(2):
                cells = []
                for width in (1, 2, 4, 8):
                    res = []
                    for L in (A, B):
                        x = {w.inner: torch.randn(width, w.inner) for w in L}
                        res.append(bench_gemm.best_ms(lambda: [w.matmul(x[w.inner]) for w in L], 9))
                    cells.append(f"w{width} {res[0]:.2f}/{res[1]:.2f} ({res[0]/res[1]:.2f})")
                print(which, threads, "  ".join(cells), flush=True)
