"""The verifier's C kernels (``kernels/``): GEMMs on GGUF blocks as stored, exact-rows attention and the layer's
row-wise glue, one source per ISA beside a plain-C reference:

  generic  gemm_generic.c, ops_generic.c   plain C, baseline flags: the reference and the portable path (ARM)
  avx2     gemm_avx2.c, ops_avx2.c         AVX2 + FMA + F16C (Intel since Haswell, AMD Zen)
  avx512   gemm_avx512.c, ops_avx512.c     AVX-512 F/BW/VL + FMA + F16C
  avx512vnni  gemm_q8x8_avx512vnni.c       the avx512 path with its x8 int8 GEMM on VNNI (vpdpbusd), 16 weight
                                           rows a register: the same bits as avx512, several times the
                                           arithmetic a cycle (Zen 4/5, Intel since Ice Lake)

Every source an x86-64 machine can build goes into one shared library (non-x86: the generic ones), compiled
on first use with the system's C compiler (each file with its own -m flags) into ``$XDG_CACHE_HOME/tandem``:
one file per source version, flags and torch version, built under a temporary name and renamed, so
concurrent starts are safe. The ISA is chosen at run time (``isa()``): the best this CPU runs
(avx512 + avx512_vnni -> avx512vnni; avx512f+bw+vl+fma+f16c -> avx512; avx2+fma+f16c -> avx2; else generic), or the one ``TANDEM_ISA``
(the verifier's ``--isa``) names. Within one ISA every row of a block runs the same instructions whatever
the block width or thread count (exact rows); across ISAs results agree to fp32 rounding. One exception, by
measurement: the int8 GEMM on the x8 layout computes the same bits on every x86 path, so it runs through a
table (``gemm_q8x8_pick.c``) that ``x8_pick`` fills at load with the fastest path per weight type and row count
(on Zen 4 the 256-bit avx2 kernel beats VNNI at one row); ``TANDEM_ISA`` turns that off.

-ffp-contract=off: weights are rebuilt with gguf-py's roundings (no fused multiply-add there); the SIMD
accumulations use explicit FMA intrinsics. -fopenmp, linked against the libgomp torch has loaded (same
SONAME: one OpenMP runtime, so the kernels share torch's threads; called from the torch thread).

``library()`` is the chosen ISA's ``Kernels``, or None where none can be built (``unavailable_reason()``:
no ``cc``, a failed build); callers then fall back to torch.
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

import numpy as np
import torch

KERNELS = Path(__file__).with_name("kernels")
ISAS = ("avx512vnni", "avx512", "avx2", "generic")
ENV = "TANDEM_ISA"
SOURCES = {"generic": ("gemm_generic.c", "gemm_q8_generic.c", "ops_generic.c", "decoder_layers.c", "gemm_q8x8_pick.c",
                       "coupling.c", "head_bound_generic.c"),
           "avx2": ("gemm_avx2.c", "gemm_q8_avx2.c", "ops_avx2.c", "head_bound_avx2.c"),
           "avx512": ("gemm_avx512.c", "gemm_q8_avx512.c", "ops_avx512.c"),
           "avx512vnni": ("gemm_q8x8_avx512vnni.c",)}
BASE_ISA = {"avx512vnni": "avx512"}   # a path with its own x8 GEMM only: every other kernel is this one's
ISA_CFLAGS = {"generic": (), "avx2": ("-mavx2", "-mfma", "-mf16c"),
              "avx512": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma", "-mf16c"),
              "avx512vnni": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma", "-mf16c", "-mavx512vnni")}
REQUIRED_CPU_FLAGS = {"generic": set(), "avx2": {"avx2", "fma", "f16c"},
                      "avx512": {"avx512f", "avx512bw", "avx512vl", "fma", "f16c"},
                      "avx512vnni": {"avx512f", "avx512bw", "avx512vl", "fma", "f16c", "avx512_vnni"}}
# -fno-tree-loop-distribute-patterns: gcc turned the zeroing of a kernel's accumulator array into a
# `rep stosq` memset per output row (204 672 calls a forward: +20 % at width 8, measured)
CFLAGS = ("-O3", "-fno-tree-loop-distribute-patterns", "-ffp-contract=off", "-fopenmp", "-fPIC")
ABI = 3
STALE_BUILD_DAYS = 14          # builds of other kernel sources not loaded this long are removed from the cache
HEAD_BOUND_ISAS = ("avx2", "generic")          # kernels/head_bound_<isa>.c (avx512 runs avx2's: 256-bit integer sums)
X8_ISAS = ("avx2", "avx512", "avx512vnni")      # ISAs with the int8 GEMM on 8 interleaved weight rows (kernels/gemm_q8x8_x86.h)


def _x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def built_isas() -> tuple[str, ...]:
    """The ISAs whose sources this machine compiles: all three on x86-64, the generic path elsewhere."""
    return ISAS if _x86() else ("generic",)


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    # no /proc/cpuinfo (macOS, ...): torch's own detection of the vector ISA
    capability = torch.backends.cpu.get_cpu_capability() if _x86() else "DEFAULT"
    return frozenset({"AVX512": REQUIRED_CPU_FLAGS["avx512"], "AVX2": REQUIRED_CPU_FLAGS["avx2"]}.get(capability, ()))


def runnable_isas() -> tuple[str, ...]:
    """The ISAs this CPU runs, best first (always ending with 'generic')."""
    return tuple(i for i in built_isas() if REQUIRED_CPU_FLAGS[i] <= _cpu_flags())


def isa() -> str:
    """The ISA in use: ``TANDEM_ISA`` when set (auto or empty: detect), else the best this CPU runs.
    Raises ValueError for an unknown name or one this CPU cannot run, naming the flag and the fix."""
    forced = _forced_name()
    best = runnable_isas()[0]
    if not forced:
        return best
    if forced not in ISAS:
        raise ValueError(f"--isa {forced!r} ({ENV}): not one of auto, {', '.join(ISAS)}")
    if forced not in runnable_isas():
        missing = REQUIRED_CPU_FLAGS[forced] - _cpu_flags()
        what = f"lacks {', '.join(sorted(missing))}" if missing and _x86() else f"is {platform.machine()}"
        raise ValueError(f"--isa {forced} ({ENV}={forced}): this CPU {what}; use --isa {best} or leave it unset "
                         "(auto: the best this CPU runs)")
    return forced


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tandem"


def prune_stale_builds(keep: Path, days: float = STALE_BUILD_DAYS) -> list[Path]:
    """Removes the kernel builds beside ``keep`` (other ``tandem_kernels-*.so``: other sources, flags or torch)
    that no process has loaded for ``days`` (every load touches its file), and returns them. Each upgrade
    builds a new library of ~1.4 MB; without this the cache keeps every one. A build still in use elsewhere
    (another install sharing the cache) is touched on its every load, so it stays; one removed is rebuilt
    on its next start. Errors are ignored: a cache left as it was is harmless."""
    import time

    cutoff = time.time() - days * 86400.0
    removed = []
    for old in keep.parent.glob("tandem_kernels-*.so"):
        try:
            if old != keep and old.stat().st_mtime < cutoff:
                old.unlink()
                removed.append(old)
        except OSError:
            continue
    return removed


def _compile(cc: str, out_dir: Path) -> list[Path] | str:
    """Compiles every source of ``built_isas()`` into objects under ``out_dir`` (in parallel); the objects,
    or why not."""
    jobs = []
    for which in built_isas():
        for name in SOURCES[which]:
            obj = out_dir / (Path(name).stem + ".o")
            cmd = [cc, *CFLAGS, *ISA_CFLAGS[which], "-c", str(KERNELS / name), "-o", str(obj)]
            try:
                jobs.append((cmd, obj, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                        text=True)))
            except OSError as e:
                return f"building the C kernels failed: {e}"
    failed = ""
    for cmd, _, proc in jobs:
        try:
            _, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            err = "timed out"
        if proc.returncode != 0 and not failed:
            failed = f"building the C kernels failed ({' '.join(cmd)}): {err.strip()[-400:]}"
    return failed or [obj for _, obj, _ in jobs]


def _declare(lib: ctypes.CDLL) -> None:
    i64, ptr, f32, cint = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
    for which in built_isas():
        if which in X8_ISAS:
            f = getattr(lib, f"tq_gemm_q8x8_{which}")
            f.argtypes, f.restype = [cint, ptr, i64, i64, ptr, i64, ptr, ptr, i64, cint], cint
            f = getattr(lib, f"tq_gemm_parts_q8x8_{which}")
            f.argtypes, f.restype = [cint, ptr, ptr, ptr, ptr, i64, i64, ptr, i64, cint], cint
        if which in BASE_ISA:
            continue
        gemm = getattr(lib, f"tq_gemm_{which}")
        gemm.argtypes = [cint, ptr, i64, i64, ptr, i64, i64, ptr, ptr, i64, cint]
        gemm.restype = cint
        q8 = getattr(lib, f"tq_gemm_q8_{which}")
        q8.argtypes, q8.restype = gemm.argtypes, cint
        for name in ("tq_gemm_parts", "tq_gemm_parts_q8"):
            f = getattr(lib, f"{name}_{which}")
            f.argtypes, f.restype = [cint, ptr, ptr, ptr, ptr, ptr, i64, i64, ptr, i64, cint], cint
        attention = getattr(lib, f"tq_attention_{which}")
        attention.argtypes = [ptr, i64, i64, i64, i64, i64, ptr, ptr, i64, i64, i64, f32, ptr, cint]
        attention.restype = None
        blocks = getattr(lib, f"tq_attention_blocks_{which}")
        blocks.argtypes, blocks.restype = [ptr, i64, i64, i64, i64, i64, f32, cint], None
        for name in ("tq_silu_mul", "tq_gelu_tanh_mul"):
            f = getattr(lib, f"{name}_{which}")
            f.argtypes, f.restype = [ptr, i64, i64, ptr], None
    lib.tq_q8x8_pick.argtypes, lib.tq_q8x8_pick.restype = [cint, i64, ptr, ptr], cint
    lib.tq_gemm_q8x8_picked.argtypes, lib.tq_gemm_q8x8_picked.restype = [cint, ptr, i64, i64, ptr, i64, ptr, ptr, i64,
                                                                         cint], cint
    lib.tq_gemm_parts_q8x8_picked.argtypes = [cint, ptr, ptr, ptr, ptr, i64, i64, ptr, i64, cint]
    lib.tq_gemm_parts_q8x8_picked.restype = cint
    lib.tq_pack_q8x8.argtypes, lib.tq_pack_q8x8.restype = [cint, ptr, i64, i64, i64, ptr, cint], cint
    lib.tq_q8x8_bytes.argtypes, lib.tq_q8x8_bytes.restype = [cint, i64, i64], i64
    lib.tq_dequantize_rows_q8x8.argtypes = [cint, ptr, i64, ptr, i64, ptr, cint]
    lib.tq_dequantize_rows_q8x8.restype = cint
    lib.tq_repack_scaled.argtypes, lib.tq_repack_scaled.restype = [cint, ptr, i64, i64, i64, ptr, cint], cint
    lib.tq_scaled_row_bytes.argtypes, lib.tq_scaled_row_bytes.restype = [cint, i64], i64
    lib.tq_dequantize_rows.argtypes = [cint, ptr, i64, ptr, i64, i64, ptr, cint]
    lib.tq_dequantize_rows.restype = cint
    lib.tq_add_rms_norm.argtypes = [ptr, ptr, i64, i64, ptr, f32, ptr]
    lib.tq_head_rms_norm.argtypes = [ptr, i64, i64, i64, i64, ptr, f32]
    lib.tq_rope_store.argtypes = [ptr, i64, i64, i64, i64, ptr, ptr, ptr, ptr, i64, i64, ptr, cint]
    for f in (lib.tq_add_rms_norm, lib.tq_head_rms_norm, lib.tq_rope_store):
        f.restype = None
    lib.tq_decoder_layers.argtypes = [ptr, ptr, i64, ptr, ptr, ptr, i64, ptr, cint]
    lib.tq_decoder_layers.restype = cint
    u64, f64 = ctypes.c_uint64, ctypes.c_double
    lib.tq_coupled_candidates.argtypes = [ptr, i64, f64, u64, u64, f64, ptr, ptr, i64]
    lib.tq_coupled_candidates.restype = i64
    for which in HEAD_BOUND_ISAS:
        if which in built_isas():
            f = getattr(lib, f"tq_head_bound_{which}")
            f.argtypes, f.restype = [cint, ptr, i64, i64, ptr, i64, i64, ptr, i64, ptr, ptr, cint], cint


@functools.cache
def _build() -> tuple[ctypes.CDLL | None, str]:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None, "no C compiler (cc/gcc) to build the kernels"
    digest = hashlib.sha256(" ".join((*CFLAGS, *built_isas(), cc, platform.machine(), torch.__version__)).encode())
    for which in built_isas():
        digest.update(" ".join(ISA_CFLAGS[which]).encode())
    for src in sorted(KERNELS.glob("*.[ch]")):
        digest.update(src.name.encode() + src.read_bytes())
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
            objects = _compile(cc, Path(tmp))
            if isinstance(objects, str):
                return None, objects
            built = Path(tmp) / target.name
            cmd = [cc, "-shared", "-fopenmp", *map(str, objects), "-o", str(built), f"-L{gomp_dir}", "-lm"]
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
    if lib.tq_abi() != ABI:
        return None, "the C kernels' ABI does not match"
    _declare(lib)
    try:
        os.utime(target)            # this build is in use (prune_stale_builds)
    except OSError:
        pass
    prune_stale_builds(target)
    return lib, ""


class Kernels:
    """One ISA's functions of the library (ctypes; pointers as ints). Per-ISA: ``gemm``, ``gemm_parts`` (and their
    int8-activation forms ``gemm_q8``, ``gemm_parts_q8``), ``attention``,
    ``silu_mul``, ``gelu_tanh_mul``; the same on every ISA (memory-light, no exp): ``add_rms_norm``,
    ``head_rms_norm``, ``rope_store``, ``dequantize_rows``. Arguments: kernels/quants.h (GEMM),
    kernels/ops_generic.c (the rest). ``verifier_service.quant`` wraps them for torch tensors."""

    def __init__(self, lib: ctypes.CDLL, which: str, picked: bool = False):
        self.isa = which
        x8, which = which, BASE_ISA.get(which, which)      # avx512vnni: avx512's kernels, its own x8 GEMM
        self.gemm = getattr(lib, f"tq_gemm_{which}")
        self.gemm_parts = getattr(lib, f"tq_gemm_parts_{which}")
        self.gemm_q8 = getattr(lib, f"tq_gemm_q8_{which}")               # int8 activations: kernels/gemm_q8.h
        self.gemm_parts_q8 = getattr(lib, f"tq_gemm_parts_q8_{which}")
        self.gemm_q8x8 = getattr(lib, f"tq_gemm_q8x8_{x8}") if x8 in X8_ISAS else None
        self.gemm_parts_q8x8 = getattr(lib, f"tq_gemm_parts_q8x8_{x8}") if x8 in X8_ISAS else None
        # picked: the x8 GEMM through kernels/gemm_q8x8_pick.c, whose table x8_pick.py fills by measurement
        # (every x86 path's x8 kernel computes the same bits); until then, this ISA's own kernel
        self.picked = picked and self.gemm_q8x8 is not None
        if self.picked:
            _pick_table_defaults(lib, self.gemm_q8x8, self.gemm_parts_q8x8)
            self.gemm_q8x8, self.gemm_parts_q8x8 = lib.tq_gemm_q8x8_picked, lib.tq_gemm_parts_q8x8_picked
        self.q8x8_pick = lib.tq_q8x8_pick
        self.pack_q8x8 = lib.tq_pack_q8x8
        self.q8x8_bytes = lib.tq_q8x8_bytes
        self.dequantize_rows_q8x8 = lib.tq_dequantize_rows_q8x8
        self.attention = getattr(lib, f"tq_attention_{which}")
        self.attention_blocks = getattr(lib, f"tq_attention_blocks_{which}")   # several sessions' blocks in one call
        self.silu_mul = getattr(lib, f"tq_silu_mul_{which}")
        self.gelu_tanh_mul = getattr(lib, f"tq_gelu_tanh_mul_{which}")
        self.add_rms_norm = lib.tq_add_rms_norm
        self.head_rms_norm = lib.tq_head_rms_norm
        self.dequantize_rows = lib.tq_dequantize_rows
        self.repack_scaled = lib.tq_repack_scaled       # legacy blocks with fp32 scales (quant.QuantWeight.scaled)
        self.scaled_row_bytes = lib.tq_scaled_row_bytes
        self._rope_store = lib.tq_rope_store
        self.decoder_layers = lib.tq_decoder_layers     # the layer loop in one call: kernels/decoder_layers.c
        self._coupled_candidates = lib.tq_coupled_candidates
        # the head's logits to within a proven bound (kernels/head_bound.h; verifier_service/greedy_head.py)
        self.head_bound = getattr(lib, f"tq_head_bound_{'generic' if which == 'generic' else 'avx2'}")

    def coupled_candidates(self, logits, temperature: float, key: int, high: int, floor: float):
        """kernels/coupling.c over a float32 row (numpy, contiguous): (indices int64, 53-bit noise uint64) of
        the tokens that can win coupled sampling's race (tandem.coupling.candidates, the numpy reference)."""
        n = int(logits.shape[0])
        cap = 4096
        while True:
            index, bits = np.empty(cap, dtype=np.int64), np.empty(cap, dtype=np.uint64)
            m = self._coupled_candidates(logits.ctypes.data, n, float(temperature), key, high, float(floor),
                                         index.ctypes.data, bits.ctypes.data, cap)
            if m <= cap:
                return index[:m], bits[:m]
            cap = int(m)

    def row_attention(self, q, q_row, n, heads, kv_heads, d, k, v, cap, start, scale, out, threads, window=0):
        """``attention`` with the window last (0: every earlier key)."""
        self.attention(q, q_row, n, heads, kv_heads, d, k, v, cap, start, window, scale, out, threads)

    def rope_store(self, qkv, n, heads, kv_heads, d, cos, sin, k_cache, v_cache, cap, start, q_out, interleaved=0):
        self._rope_store(qkv, n, heads, kv_heads, d, cos, sin, k_cache, v_cache, cap, start, q_out, interleaved)


PICK_KINDS, PICK_ROWS = 64, 33          # kernels/gemm_q8x8_pick.c's table: GGUF type codes x row counts


_pick_table_set = False


def _pick_table_defaults(lib: ctypes.CDLL, one, parts) -> None:
    """Every entry of the x8 table: ``one``/``parts`` (once a process: a measured choice is not undone)."""
    global _pick_table_set
    if _pick_table_set:
        return
    for kind in range(PICK_KINDS):
        for rows in range(PICK_ROWS):
            lib.tq_q8x8_pick(kind, rows, ctypes.cast(one, ctypes.c_void_p), ctypes.cast(parts, ctypes.c_void_p))
    _pick_table_set = True


@functools.cache
def _kernels(which: str, picked: bool = False) -> Kernels:
    lib, why = _build()
    if lib is None:
        raise RuntimeError(f"the C kernels are not available: {why}")
    return Kernels(lib, which, picked)


def _forced_name() -> str:
    """The ISA ``TANDEM_ISA`` names, lower-case ('' when unset, empty or 'auto')."""
    name = os.environ.get(ENV, "").strip().lower()
    return "" if name == "auto" else name


def forced() -> bool:
    """Whether ``TANDEM_ISA`` names an ISA (then every kernel is that ISA's: nothing is picked by measurement)."""
    return bool(_forced_name())


def x8_isas() -> tuple[str, ...]:
    """The ISAs with an x8 int8 GEMM this CPU runs, best by its flags first (``x8_pick`` chooses among them)."""
    return tuple(i for i in runnable_isas() if i in X8_ISAS)


def kernels(which: str | None = None) -> Kernels:
    """The kernels of ISA ``which`` (None: ``isa()``, with the int8 x8 GEMM picked by measurement among
    ``x8_isas()`` unless ``TANDEM_ISA`` forces one: ``x8_pick``). Raises ValueError where this CPU cannot run
    it, RuntimeError where the library cannot be built."""
    if which is None:
        which = isa()
        return _kernels(which, not forced() and len(x8_isas()) > 1)
    if which not in runnable_isas():
        raise ValueError(f"ISA {which!r} cannot run here (this CPU runs {', '.join(runnable_isas())})")
    return _kernels(which)


def library() -> Kernels | None:
    """The kernels of the ISA in use (``isa()``), or None where the library cannot be built."""
    return kernels() if _build()[0] is not None else None


def unavailable_reason() -> str:
    return _build()[1]
