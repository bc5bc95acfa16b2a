"""The CPU's fp32 FMA peak, and what it implies for the cost of each extra row of a verify block.

    python -m tandem.bench.fma_peak --threads 2            # and --macs 134.5e6 for another target

A verify block of w positions multiplies every weight by w rows of activations. Whatever the kernel, each
extra row costs at least (multiply-adds of one row) / (peak FMA throughput) once the weights are in
registers: with exact fp32 arithmetic that is the floor on the slope of forward ms against block width.
This builds a small C loop (12 independent AVX-512 FMA chains per thread, no memory traffic) with the
system compiler, runs it on ``--threads`` OpenMP threads, and prints GFLOPS and that floor for the default
target (SmolLM2-135M: 134.5 M multiply-adds a row, the tied head included). Needs cc, AVX-512 and Linux.

What it measured on this project's machines is in BENCHMARKS.md (the floor it sets on a verify block's cost).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SMOLLM2_135M_MACS = 134.5e6     # 30 layers x (960 + 576 + 3072) x 576 + 30 x 576 x 1536 + 49152 x 576 (head)

SOURCE = r"""
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
int main(void) {
    const long iters = 20000000;
    double best = 0.0;
    for (int rep = 0; rep < 5; rep++) {
        float sink = 0.0f;
        double t0 = omp_get_wtime();
#pragma omp parallel reduction(+ : sink)
        {
            __m512 a[12];
            const __m512 b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
            for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
            for (long it = 0; it < iters; it++) {
#pragma GCC unroll 12
                for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
            }
            for (int i = 0; i < 12; i++) sink += _mm512_reduce_add_ps(a[i]);
        }
        double t = omp_get_wtime() - t0;
        double gflops = 2.0 * 16 * 12 * (double)iters * omp_get_max_threads() / t / 1e9;
        if (gflops > best) best = gflops;
        if (sink == 1.0f) printf(" ");
    }
    printf("%.1f\n", best);
    return 0;
}
"""


def peak_gflops(threads: int) -> float:
    """Best of 5 runs of the FMA loop on ``threads`` threads, GFLOPS (2 flops per FMA lane)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc/gcc)")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "peak.c", Path(tmp) / "peak"
        src.write_text(SOURCE)
        subprocess.run([cc, "-O3", "-mavx512f", "-fopenmp", str(src), "-o", str(exe)], check=True,
                       capture_output=True, text=True)
        out = subprocess.run([str(exe)], check=True, capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    return float(out.stdout.split()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads (default 1)")
    p.add_argument("--macs", type=float, default=SMOLLM2_135M_MACS,
                   help="multiply-adds of one row through the target (default: SmolLM2-135M, 134.5e6)")
    args = p.parse_args(argv)
    from tandem.bench.forward_costs import cpu_model

    try:
        gflops = peak_gflops(args.threads)
    except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
        print(f"fma_peak: cannot measure here: {e}", file=sys.stderr)
        return 1
    row_ms = 2 * args.macs / (gflops * 1e9) * 1e3
    print(f"CPU {cpu_model()}, {args.threads} thread(s): fp32 FMA peak {gflops:.0f} GFLOPS; one extra row of "
          f"{args.macs / 1e6:.1f} M multiply-adds costs at least {row_ms:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
