"""The machine and software a benchmark ran on: CPU, cores, load, library versions, git commit."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path

from tandem.pb import PACKAGE_ROOT

PACKAGES = ("torch", "transformers", "onnxruntime", "onnxruntime-gpu", "grpcio", "protobuf", "numpy", "gguf",
            "tandem-spec")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_label() -> str:
    """The CPU as the reports print it beside every figure: lscpu's model name, family and model (a
    virtual machine's bare "AMD EPYC" says which generation only by those), CPUs, widest vector ISA."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines():
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
    except OSError:
        return cpu_model()
    flags = set(fields.get("flags", "").split())
    isa = next((f for f in ("avx512f", "avx2", "avx", "sse4_2") if f in flags), None)
    parts = [f"family {fields['cpu family']} model {fields['model']}" if "cpu family" in fields else None,
             f"{os.cpu_count()} CPUs", isa and isa.replace("avx512f", "avx512") + (" + fma" if "fma" in flags else "")]
    return f"{cpu_model()} ({', '.join(p for p in parts if p)})"


def cpu_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c")))
    except OSError:
        pass
    return []


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def memory_total_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def git_commit(root: Path = PACKAGE_ROOT) -> dict:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10,
                              check=False).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return {"commit": None}
    return {"commit": commit or None, "dirty": dirty}


def environment() -> dict:
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    try:
        import torch

        torch_threads = torch.get_num_threads()
    except ImportError:
        torch_threads = None
    return {
        "cpu": cpu_model(), "cpu_label": cpu_label(), "cpu_flags": cpu_flags(), "logical_cores": os.cpu_count(), "usable_cores": affinity,
        "memory_bytes": memory_total_bytes(), "platform": platform.platform(), "hostname": platform.node(),
        "versions": versions(), "git": git_commit(), "torch_threads_bench_process": torch_threads,
        "load_average_start": load_average(),
    }


# ---- the memory-bandwidth floor -------------------------------------------------------------------
def read_bandwidth_gbs(threads: int = 0, mib: int = 512) -> dict:
    """Read bandwidth of this machine now, in GB/s: the time to read a ``mib`` MiB float32 buffer once
    (far beyond the caches), best of a few tries. With torch: ``tandem.bench.forward_costs``'s reader
    (sum, dot, matrix-vector product) on ``threads`` torch threads (0: torch's default), the verifier's
    count; else numpy's sum (one thread). Never raises: ``{"error": ...}`` instead."""
    import time as _time

    try:
        import torch

        try:
            from tandem.bench.forward_costs import read_bandwidth_gbs as _reader
        except ImportError:
            _reader = None
        before = torch.get_num_threads()
        if threads:
            torch.set_num_threads(threads)
        try:
            if _reader is not None:
                gbs = _reader(torch, mib=mib)
                how = "tandem.bench.forward_costs.read_bandwidth_gbs (torch sum/dot/mv, best of 5 each)"
            else:
                x = torch.ones(mib * 2**20 // 4)
                x.sum()
                best = min(_timed(x.sum) for _ in range(5))
                gbs = x.numel() * 4 / best / 1e9
                how = "torch sum, best of 5"
            used = torch.get_num_threads()
        finally:
            torch.set_num_threads(before)
        return {"gb_per_s": gbs, "buffer_mib": mib, "threads": used, "method": how}
    except ImportError:
        pass
    try:
        import numpy as np

        x = np.ones(mib * 2**20 // 4, dtype=np.float32)
        x.sum()
        t = []
        for _ in range(5):
            t0 = _time.perf_counter()
            x.sum()
            t.append(_time.perf_counter() - t0)
        return {"gb_per_s": x.nbytes / min(t) / 1e9, "buffer_mib": mib, "threads": 1, "method": "numpy sum, best of 5"}
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}"}


def _timed(fn) -> float:
    import time as _time

    t0 = _time.perf_counter()
    fn()
    return _time.perf_counter() - t0


def gguf_weights(path) -> dict:
    """Sizes of a GGUF model's weights: the file's bytes (what llama.cpp reads per token, quantised) and
    the parameter count (x 4 = the bytes of the fp32 copy the verifier holds). Never raises."""
    out: dict = {"path": str(path)}
    try:
        out["file_bytes"] = Path(path).stat().st_size
    except OSError as exc:
        out["error"] = str(exc)
        return out
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        params = sum(int(t.n_elements) for t in reader.tensors)
        quant = sum(int(t.n_bytes) for t in reader.tensors)
        out.update(parameters=params, fp32_bytes=params * 4, tensor_bytes=quant)
    except Exception as exc:  # noqa: BLE001 - the gguf package is optional here
        out["note"] = f"parameter count unknown ({type(exc).__name__}: {exc})"
    return out


def floor(weights: dict, bandwidth: dict) -> dict:
    """The memory-bandwidth floor of plain decoding: every weight read once per token, at the measured
    read bandwidth. Gives ms per token and the tokens/s it caps, for the fp32 weights (the verifier) and
    the GGUF tensors (llama.cpp)."""
    bw = bandwidth.get("gb_per_s")
    out: dict = {"gb_per_s": bw}
    if not bw:
        return out
    is_gguf = str(weights.get("path", "")).endswith(".gguf")
    for key, name in (("fp32_bytes", "fp32"), ("tensor_bytes", "gguf")):
        b = weights.get(key) or (weights.get("file_bytes") if key == "tensor_bytes" and is_gguf else None)
        if b:
            ms = b / (bw * 1e9) * 1e3
            out[name] = {"bytes": b, "ms_per_token": ms, "tokens_per_s": 1e3 / ms}
    return out


def hf_dir_weights(directory) -> dict:
    """Like ``gguf_weights`` for a Hugging Face directory: the parameter count from the safetensors headers
    (x 4 = the fp32 copy the verifier holds). Never raises."""
    import json as _json
    import struct

    out: dict = {"path": str(directory)}
    params, files = 0, sorted(Path(directory).glob("*.safetensors"))
    try:
        for f in files:
            with open(f, "rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                header = _json.loads(fh.read(n))
            for name, t in header.items():
                if name != "__metadata__":
                    size = 1
                    for d in t["shape"]:
                        size *= d
                    params += size
    except (OSError, ValueError, KeyError, struct.error) as exc:
        out["note"] = f"parameter count unknown ({type(exc).__name__}: {exc})"
        return out
    if not params:
        out["note"] = "no safetensors weights found"
        return out
    out.update(file_bytes=sum(f.stat().st_size for f in files), parameters=params, fp32_bytes=params * 4)
    return out


def target_weights(target_spec: str) -> dict:
    """The weights of the bench's target (a GGUF or an HF directory). Never raises."""
    try:
        from tandem.models import resolve

        loc = resolve(target_spec)
    except (FileNotFoundError, ImportError) as exc:
        return {"note": f"target not found here: {exc}"}
    if loc.gguf_file:
        return gguf_weights(loc.directory / loc.gguf_file)
    return hf_dir_weights(loc.directory)
