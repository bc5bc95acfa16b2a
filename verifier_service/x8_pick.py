"""Which ISA's int8 x8 GEMM runs a call of n rows, chosen by timing this model's weights on this CPU at load.

Every x86 path's x8 kernel computes the same bits (``kernels/gemm_q8x8_pick.c`` says why), so the choice is
free to follow speed, per weight type and row count: a plain step may run one path and a verify block another
and every row is still what it would be alone. What is fastest is not what the CPU's flags say everywhere: on
Zen 4 (512-bit instructions in two passes) the 256-bit avx2 kernel runs one row 15-25 % faster than the VNNI
kernel and eight rows 30 % slower; on Zen 5 VNNI wins at every width (BENCHMARKS.md).

``pick(weights, threads)``: for each x8 type among the weights, times every x8 ISA this CPU runs on up to
``MAX_BYTES`` of that type's weights (more than a last-level cache, so a plain step's pass is timed as it
streams from RAM) at each of ``WIDTHS`` rows, interleaved, ``REPEATS`` times; keeps the fastest per width
(another ISA than the flags' best only when ``MARGIN`` faster), and fills the kernels' table: a row count
takes the choice of the nearest measured width at or above it, wider calls the widest's. Returns the
choices; ``describe(choices)`` is the start-up line's part. ``TANDEM_ISA`` (``--isa``) turns the choice off:
every call runs the named ISA.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Mapping, Sequence

import torch

from verifier_service import native

log = logging.getLogger(__name__)

WIDTHS = (1, 2, 4, 8, 16)
REPEATS = 3
MAX_BYTES = 128 << 20
MARGIN = 0.97        # another ISA must be 3 % faster than the flags' choice at a width to run it


def _candidates(weights: Sequence) -> dict[str, list]:
    """The picked x8 weights by type, each type's first ``MAX_BYTES`` (in model order)."""
    by_kind: dict[str, list] = {}
    size: dict[str, int] = {}
    for w in weights:
        if getattr(w, "x8", None) is None or not w._kernels.picked or size.get(w.kind, 0) >= MAX_BYTES:
            continue
        by_kind.setdefault(w.kind, []).append(w)
        size[w.kind] = size.get(w.kind, 0) + w.x8.nbytes
    return by_kind


def _time(fn, ws: Sequence, x: Mapping[int, torch.Tensor], y: Sequence[torch.Tensor], n: int, threads: int) -> float:
    t0 = time.perf_counter()
    for w, out in zip(ws, y):
        if fn(w._type, x[w.inner].data_ptr(), n, w.inner, w.x8.ctypes.data, w.out, None, out.data_ptr(),
              out.stride(0), threads):
            raise RuntimeError(f"an x8 GEMM refused {w.kind} [{w.out}, {w.inner}]")
    return time.perf_counter() - t0


def pick(weights: Sequence, threads: int | None = None, widths: Sequence[int] = WIDTHS,
         repeats: int = REPEATS) -> dict[str, dict[int, str]]:
    """Times and sets the x8 GEMM per type and width (see the module docstring): {type: {width: ISA}}, empty
    where there is nothing to choose (one x8 ISA, ``TANDEM_ISA`` set, no x8 weights)."""
    isas = native.x8_isas()
    by_kind = _candidates(weights)
    if len(isas) < 2 or not by_kind:
        return {}
    threads = int(threads or torch.get_num_threads())
    own = {isa: native.kernels(isa) for isa in isas}
    widths = sorted(set(int(w) for w in widths))
    gen = torch.Generator().manual_seed(0)
    choices: dict[str, dict[int, str]] = {}
    for kind, ws in by_kind.items():
        x = {inner: torch.randn(widths[-1], inner, generator=gen) for inner in {w.inner for w in ws}}
        y = [torch.empty(widths[-1], w.out) for w in ws]
        best: dict[tuple[int, str], float] = {}
        for r in range(repeats):
            for n in widths:
                order = isas[r % len(isas):] + isas[:r % len(isas)]      # each ISA first in turn
                for isa in order:
                    t = _time(own[isa].gemm_q8x8, ws, x, y, n, threads)
                    best[n, isa] = min(best.get((n, isa), t), t)
        flags = isas[0]
        choices[kind] = {}
        for n in widths:
            fastest = min(isas, key=lambda i: best[n, i])
            choices[kind][n] = fastest if best[n, fastest] < MARGIN * best[n, flags] else flags
        log.info("x8 GEMM %s, ms per pass over %d MB: %s", kind, sum(w.x8.nbytes for w in ws) >> 20,
                 "; ".join(f"{n} rows " + " ".join(f"{i} {1e3 * best[n, i]:.2f}" for i in isas) for n in widths))
        install(kind, choices[kind])
    return choices


def install(kind: str, chosen: Mapping[int, str]) -> None:
    """Sets the table's entries of GGUF type ``kind`` from ``chosen`` ({width: ISA}; every row count takes the
    nearest width at or above it, wider calls the widest's)."""
    from gguf import GGMLQuantizationType

    widths = sorted(chosen)
    for rows in range(native.PICK_ROWS):
        width = widths[-1] if rows == 0 else next((w for w in widths if w >= rows), widths[-1])
        k = native.kernels(chosen[width])
        if k.q8x8_pick(int(GGMLQuantizationType[kind]), rows, ctypes.cast(k.gemm_q8x8, ctypes.c_void_p),
                       ctypes.cast(k.gemm_parts_q8x8, ctypes.c_void_p)):
            raise RuntimeError(f"cannot set the x8 GEMM of {kind} at {rows} rows")


def describe(choices: Mapping[str, Mapping[int, str]]) -> str:
    """'Q4_K: avx2 at 1-2 rows, avx512vnni from 3; Q6_K: avx512vnni' (row ranges as ``pick`` installs them)."""
    parts = []
    for kind, chosen in choices.items():
        widths = sorted(chosen)
        runs: list[tuple[int, str]] = []             # (first row count, ISA)
        low = 1
        for w in widths:
            if not runs or runs[-1][1] != chosen[w]:
                runs.append((low, chosen[w]))
            low = w + 1
        if len(runs) == 1:
            parts.append(f"{kind}: {runs[0][1]}")
            continue
        spans = []
        for i, (first, isa) in enumerate(runs):
            if i + 1 < len(runs):
                last = runs[i + 1][0] - 1
                spans.append(f"{isa} at {first}-{last} rows" if last > first else f"{isa} at {first} row{'s' * (first > 1)}")
            else:
                spans.append(f"{isa} from {first}")
        parts.append(f"{kind}: {', '.join(spans)}")
    return "; ".join(parts)
