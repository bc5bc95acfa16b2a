"""The GPU check's ``env`` step: what the machine has (``env.json``), and whether torch can run on the GPU.

Versions of python, torch (and its CUDA build), transformers, onnxruntime, grpc, numpy and gguf; the GPU's name,
memory and compute capability and ``nvidia-smi``'s line. On ``--device cuda`` it fails when torch sees no GPU
and otherwise runs one matmul there, so a driver that answers but cannot run a kernel fails here, before the
verifier step loads a model; on the CPU dry run the CUDA part is skipped with a note that says so.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess

from tandem.gpu_check_steps import is_cuda, log


def check_env(device: str) -> dict:
    import torch

    info = {
        "device_asked": device,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": bool(torch.cuda.is_available()),
        "cpu_count": os.cpu_count(),
    }
    from importlib import metadata

    for key, dists in (("transformers", ["transformers"]), ("onnxruntime", ["onnxruntime-gpu", "onnxruntime"]),
                       ("grpc", ["grpcio"]), ("numpy", ["numpy"]), ("gguf", ["gguf"])):
        info[key] = "missing"
        for dist in dists:
            try:
                info[key] = metadata.version(dist) + ("" if dist == dists[0] or len(dists) == 1 else f" ({dist})")
                break
            except metadata.PackageNotFoundError:
                continue
    if info["cuda_available"]:
        idx = (torch.device(device).index or 0) if is_cuda(device) else 0
        props = torch.cuda.get_device_properties(idx)
        info.update(gpu_name=torch.cuda.get_device_name(idx), gpu_count=torch.cuda.device_count(),
                    gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    gpu_capability=f"{props.major}.{props.minor}", cudnn=torch.backends.cudnn.version())
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            q = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20)
            info["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
        except Exception as e:  # noqa: BLE001
            info["nvidia_smi"] = f"failed: {e}"
    if is_cuda(device):
        info["ok"] = info["cuda_available"]
        if not info["ok"]:
            info["error"] = (f"torch {torch.__version__} (CUDA build: {torch.version.cuda}) sees no CUDA GPU: a CPU "
                             "build of torch, or no driver")
        else:
            # a real kernel, not just the driver's answer
            x = torch.randn(256, 256, device=device)
            info["matmul_ok"] = bool(torch.isfinite(x @ x).all().item())
            info["ok"] = info["matmul_ok"]
    else:
        info["ok"] = True
        info["note"] = "CPU dry run: the CUDA check is skipped"
        log(info["note"])
    return info
