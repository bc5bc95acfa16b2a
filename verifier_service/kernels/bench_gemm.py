"""Timings of the GGUF GEMM kernels on each ISA path this CPU runs (min of repeats: a noisy host inflates
the others). Run from the repository root:

    HF_HUB_OFFLINE=1 .venv/bin/python verifier_service/kernels/bench_gemm.py [--repeats 7] [--isa avx2 ...]

Table 1: ms of all linear layers of the default target (SmolLM2-135M Q4_1, its Q8_0 head; q/k/v and gate/up
merged as the decoder runs them) at block widths 1, 2, 4, 8, on 1 and 2 threads.
Table 2: each block type on model-shaped weights (576x1536 and 1536x576; K-quants 1536x512, as their rows are
whole 256-weight super-blocks), random blocks: GB/s of weight bytes read at width 1, and GFLOP/s at width 8
(2 flops a weight a row), 1 thread.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from verifier_service import native  # noqa: E402
from verifier_service.quant import KINDS, QuantWeight, row_bytes  # noqa: E402


def best_ms(fn, repeats: int) -> float:
    """Min ms of ``repeats`` calls: the calling thread's CPU time on 1 thread (time other processes take on a
    shared host does not count), wall-clock time with more threads (their waits do)."""
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    fn()
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return min(times) * 1e3


def default_linears(which: str) -> list[QuantWeight]:
    import gguf

    from tandem.models import resolve

    loc = resolve("default")
    reader = gguf.GGUFReader(str(loc.directory / loc.gguf_file))
    tensors = {t.name: t for t in reader.tensors}

    def weight(name: str) -> QuantWeight:
        t = tensors[name]
        inner, out = (int(s) for s in t.shape)
        return QuantWeight(t.tensor_type.name, t.data, out, inner, isa=which)

    layers = sorted({int(n.split(".")[1]) for n in tensors if n.startswith("blk.")})
    out = []
    for i in layers:
        p = f"blk.{i}."
        out += [QuantWeight.cat([weight(p + "attn_q.weight"), weight(p + "attn_k.weight"), weight(p + "attn_v.weight")]),
                weight(p + "attn_output.weight"),
                QuantWeight.cat([weight(p + "ffn_gate.weight"), weight(p + "ffn_up.weight")]),
                weight(p + "ffn_down.weight")]
    out.append(weight("output.weight" if "output.weight" in tensors else "token_embd.weight"))
    out[-1]._reader = reader                     # keep the map open
    return out


def random_weight(kind: str, out: int, inner: int, which: str, rng) -> QuantWeight:
    """Blocks of random bytes with small finite fp16 scales (a float kind: random values)."""
    import gguf

    if kind in ("F32", "F16", "BF16"):
        values = (rng.standard_normal((out, inner)) * 0.05).astype(np.float32)
        raw = gguf.quants.quantize(values, gguf.GGMLQuantizationType[kind]) if kind == "BF16" else \
            values.astype(np.float16 if kind == "F16" else np.float32)
        return QuantWeight(kind, raw.view(np.uint8).reshape(out, -1), out, inner, isa=which)
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    values = (rng.standard_normal((out, inner)) * 0.05).astype(np.float32)
    try:
        raw = gguf.quants.quantize(values, gguf.GGMLQuantizationType[kind])
    except (NotImplementedError, gguf.quants.QuantError):   # K-quants: random blocks, every fp16 field set small
        raw = rng.integers(0, 256, size=(out, inner // block, size), dtype=np.uint8)
        scale = np.full((out, inner // block), 0.001, np.float16).view(np.uint8).reshape(out, -1, 2)
        if kind == "Q6_K":
            raw[..., size - 2:] = scale
        else:
            raw[..., 0:2], raw[..., 2:4] = scale, scale
    return QuantWeight(kind, raw.reshape(out, row_bytes(kind, inner)), out, inner, isa=which)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--isa", nargs="*", default=list(native.runnable_isas()))
    parser.add_argument("--skip-model", action="store_true")
    parser.add_argument("--skip-kinds", action="store_true")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with torch.inference_mode():
        if not args.skip_model:
            print("all linears of the default target, ms (min of repeats)")
            print("isa      threads  " + "  ".join(f"w{w:<6}" for w in (1, 2, 4, 8)))
            for which in args.isa:
                linears = default_linears(which)
                for threads in (1, 2):
                    torch.set_num_threads(threads)
                    cells = []
                    for width in (1, 2, 4, 8):
                        x = {w.inner: torch.randn(width, w.inner) for w in linears}
                        cells.append(best_ms(lambda: [w.matmul(x[w.inner]) for w in linears], args.repeats))
                    print(f"{which:<8} {threads:<8} " + "  ".join(f"{c:<7.2f}" for c in cells), flush=True)
        if not args.skip_kinds:
            torch.set_num_threads(1)
            print("\nper block type, 1 thread: GB/s of weight bytes at width 1 | GFLOP/s at width 8")
            print("kind   isa      576x1536: w1 GB/s  w8 GFLOP/s  1536x576 (K: 1536x512): w1 GB/s  w8 GFLOP/s")
            for kind in KINDS:
                shapes = ((576, 1536), (1536, 512 if kind.endswith("_K") else 576))
                for which in args.isa:
                    cells = []
                    for out, inner in shapes:
                        w = random_weight(kind, out, inner, which, rng)
                        x1, x8 = torch.randn(1, inner), torch.randn(8, inner)
                        t1 = best_ms(lambda: w.matmul(x1), args.repeats * 3)
                        t8 = best_ms(lambda: w.matmul(x8), args.repeats * 3)
                        cells.append(f"{w.nbytes / t1 / 1e6:>11.2f}  {2 * 8 * out * inner / t8 / 1e6:>10.2f}")
                    print(f"{kind:<6} {which:<8} " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
