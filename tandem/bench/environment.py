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
        "cpu": cpu_model(), "cpu_flags": cpu_flags(), "logical_cores": os.cpu_count(), "usable_cores": affinity,
        "memory_bytes": memory_total_bytes(), "platform": platform.platform(), "hostname": platform.node(),
        "versions": versions(), "git": git_commit(), "torch_threads_bench_process": torch_threads,
        "load_average_start": load_average(),
    }
