"""The verifier's C kernels (gguf_gemm.c: GEMMs on GGUF blocks; row_attention.c: exact-rows attention;
layer_ops.c: the layer's row-wise glue),
compiled on first use with the system's C compiler into ``$XDG_CACHE_HOME/tandem`` (one file per source
version, flags and torch version; built into a temporary name and renamed, so concurrent starts are safe)
and loaded with ctypes.

-ffp-contract=off: the GGUF weight rebuild must round as gguf-py does (no fused multiply-add there); the
accumulations use explicit FMA intrinsics. -fopenmp, linked against the libgomp torch has loaded (same
SONAME: one OpenMP runtime, so the kernels share torch's threads; called from the torch thread).

``library()`` is None where the kernels cannot run, and ``unavailable_reason()`` says why: not Linux
x86-64, a CPU without AVX-512 (F/BW/VL) and FMA, no ``cc``, or a failed build. Callers fall back to torch.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCES = tuple(Path(__file__).with_name(n) for n in ("gguf_gemm.c", "row_attention.c", "layer_ops.c"))
HEADERS = tuple(Path(__file__).with_name(n) for n in ("simd_exp.h",))
# -fno-tree-loop-distribute-patterns: gcc turned the zeroing of a kernel's accumulator array into a
# `rep stosq` memset per output row (204 672 calls a forward: +20 % at width 8, measured)
CFLAGS = ("-O3", "-fno-tree-loop-distribute-patterns", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma",
          "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared")
REQUIRED_CPU_FLAGS = {"avx512f", "avx512bw", "avx512vl", "fma"}


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tandem"


def _declare(lib: ctypes.CDLL) -> None:
    i64, ptr, f32, cint = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
    lib.gguf_q4_1_gemm.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, ptr, ptr, cint]
    lib.gguf_q8_0_gemm.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, ptr, cint]
    lib.row_attention.argtypes = [ptr, i64, i64, i64, i64, i64, ptr, ptr, i64, i64, f32, ptr, cint]
    lib.add_rms_norm.argtypes = [ptr, ptr, i64, i64, ptr, f32, ptr]
    lib.rope_store.argtypes = [ptr, i64, i64, i64, i64, ptr, ptr, ptr, ptr, i64, i64, ptr]
    lib.silu_mul.argtypes = [ptr, i64, i64, ptr]
    for f in (lib.gguf_q4_1_gemm, lib.gguf_q8_0_gemm, lib.row_attention, lib.add_rms_norm, lib.rope_store,
              lib.silu_mul):
        f.restype = None


@functools.cache
def _build() -> tuple[ctypes.CDLL | None, str]:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None, f"the C kernels are for Linux x86-64 (this is {platform.system()} {platform.machine()})"
    missing = REQUIRED_CPU_FLAGS - _cpu_flags()
    if missing:
        return None, f"this CPU lacks {', '.join(sorted(missing))}"
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None, "no C compiler (cc/gcc) to build the kernels"
    digest = hashlib.sha256(" ".join(CFLAGS).encode() + torch.__version__.encode())
    for src in SOURCES + HEADERS:
        digest.update(src.read_bytes())
    name = f"tandem_kernels-{digest.hexdigest()[:16]}.so"
    target = _cache_dir() / name
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(target.parent, os.W_OK) and not target.exists():
            raise PermissionError(f"{target.parent} is not writable")
    except OSError:        # a read-only home: build under the temporary directory instead
        target = Path(tempfile.gettempdir()) / f"tandem-{os.getuid()}" / name
        target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        gomp_dir = Path(torch.__file__).parent / "lib"
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            cmd = [cc, *CFLAGS, *map(str, SOURCES), "-o", str(built), f"-L{gomp_dir}", "-lm"]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired) as e:
                return None, f"building the C kernels failed: {e}"
            if proc.returncode != 0:
                return None, f"building the C kernels failed ({' '.join(cmd)}): {proc.stderr.strip()[-400:]}"
            os.replace(built, target)
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as e:
        return None, f"loading the C kernels failed: {e}"
    if lib.gguf_gemm_abi() != 1 or lib.row_attention_abi() != 1 or lib.layer_ops_abi() != 1:
        return None, "the C kernels' ABI does not match"
    _declare(lib)
    return lib, ""


def library() -> ctypes.CDLL | None:
    return _build()[0]


def unavailable_reason() -> str:
    return _build()[1]
