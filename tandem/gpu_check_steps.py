"""The GPU check's record of its steps, ``steps.tsv``, and the two helpers every step shares.

Each step (those ``deploy/gpu-check.sh`` runs with ``timeout`` and those ``python -m tandem.gpu_check --step all``
runs in-process) leaves one tab-separated line: name, status, rc, seconds, log, note. The shell script writes
it with printf, the Python steps with ``record_step``; the summary reads it back with ``read_steps``. Kept apart
and free of torch so that the summary step runs under a plain ``python3`` even when the install failed.
"""

from __future__ import annotations

import sys
from pathlib import Path

STEPS_FILE = "steps.tsv"
STATUSES = ("pass", "fail", "skip", "timeout")


def log(msg: str) -> None:
    print(f"[gpu-check] {msg}", file=sys.stderr, flush=True)


def is_cuda(device: str) -> bool:
    return str(device).lower().startswith("cuda")


def record_step(out: Path, name: str, status: str, rc: int, seconds: float, log_file: str = "", note: str = "") -> None:
    """Appends one step's line to steps.tsv (the shell script writes the same format with printf)."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}")
    clean = [str(x).replace("\t", " ").replace("\n", " ") for x in (name, status, rc, f"{seconds:.1f}", log_file, note)]
    with open(out / STEPS_FILE, "a", encoding="utf-8") as f:
        f.write("\t".join(clean) + "\n")


def read_steps(out: Path) -> list[dict]:
    steps = []
    path = out / STEPS_FILE
    if not path.exists():
        return steps
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        parts = (line.split("\t") + [""] * 6)[:6]
        name, status, rc, seconds, log_file, note = parts
        try:
            secs = float(seconds)
        except ValueError:
            secs = float("nan")
        try:
            code = int(rc)
        except ValueError:
            code = -1
        steps.append({"name": name, "status": status, "rc": code, "seconds": secs, "log": log_file, "note": note})
    return steps
