"""GPU readiness check (``deploy/gpu-check.sh`` runs it; ``python -m tandem.gpu_check``).

Steps (``--step``):
  env       torch / CUDA / transformers versions, the device's name; fails when ``--device cuda`` and torch sees
            no GPU. Writes ``env.json``.
  verifier  loads the target with ``Target.load(spec, dtype=, device=)`` and checks that greedy decoding through
            the verifier (``start`` then ``verify`` with empty drafts: plain steps) equals HF ``generate`` greedy
            on a few prompts, on the fast path (the default ``gemm``) and eager (``gemm="mkl"``, plain
            transformers) when ``Target`` takes a ``gemm`` argument; times a plain step and verify blocks of
            width 1..8 (k = 0..7 draft tokens). Writes ``verifier.json``; fails when an output differs.
  summary   reads ``steps.tsv`` (one line a step: name, status, rc, seconds, log, note; the shell script
            writes it), ``env.json``, ``verifier.json`` and the bench's output and writes ``summary.md`` and
            ``summary.json``; exits 1 when a step failed.
  all       (default) env, verifier and summary, in this process (recording their own lines in steps.tsv).

``--device cpu`` is the dry run: the CUDA-only parts are skipped with a line that says so, everything else runs.

The command lives here; each step in a module of its own: ``gpu_check_steps`` (steps.tsv, shared helpers),
``gpu_check_env``, ``gpu_check_verifier`` and ``gpu_check_summary``. Their public names are re-exported here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

from tandem.gpu_check_env import check_env
from tandem.gpu_check_steps import STATUSES, STEPS_FILE, is_cuda, log, read_steps, record_step
from tandem.gpu_check_summary import write_summary
from tandem.gpu_check_verifier import (TEXT_PROMPTS, WIDTHS, block_agreement, check_verifier, hf_greedy,
                                       make_prompts, target_gemm_modes, time_widths, verifier_greedy)

__all__ = ["STATUSES", "STEPS_FILE", "TEXT_PROMPTS", "WIDTHS", "block_agreement", "check_env", "check_verifier",
           "default_target", "hf_greedy", "is_cuda", "log", "main", "make_prompts", "read_steps", "record_step",
           "target_gemm_modes", "time_widths", "verifier_greedy", "write_summary"]


def default_target() -> str:
    return os.environ.get("TARGET") or os.environ.get("TANDEM_TARGET") or "default"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tandem.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--step", choices=("all", "env", "verifier", "summary"), default="all")
    p.add_argument("--device", default=os.environ.get("DEVICE", "cuda"), help="cuda (default), cuda:N, or cpu (dry run)")
    p.add_argument("--cpu", action="store_true", help="the same as --device cpu")
    p.add_argument("--target", default=default_target(), help="'default', a .gguf or an HF dir [env TARGET]")
    p.add_argument("--dtype", default=os.environ.get("DTYPE", "float32"))
    p.add_argument("--out", default=os.environ.get("OUT", "gpu-check-out"))
    p.add_argument("--prompts", type=int, default=3, help="prompts compared with HF generate")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5, help="timed verify calls per width")
    p.add_argument("--modes", default=None, help="comma-separated gemm modes (default: default + mkl if supported)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    device = "cpu" if args.cpu else args.device
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    in_process = args.step == "all"
    if in_process and not (out / "plan.json").exists():
        (out / "plan.json").write_text(json.dumps({"device": device, "target": args.target,
                                                   "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                                                   "host": platform.node()}, indent=2))
    rc = 0
    if args.step in ("all", "env"):
        t0 = time.perf_counter()
        try:
            info = check_env(device)
        except Exception as e:  # noqa: BLE001
            info = {"ok": False, "device_asked": device, "error": f"{type(e).__name__}: {e}"}
        (out / "env.json").write_text(json.dumps(info, indent=2, default=str))
        for k in ("torch", "torch_cuda", "cuda_available", "gpu_name", "transformers", "error"):
            if k in info:
                print(f"{k}: {info[k]}", flush=True)
        if not info["ok"]:
            rc = 1
        if in_process:
            status = ("pass" if info["ok"] else "fail") if is_cuda(device) else "skip"
            record_step(out, "cuda", status,
                        0 if info["ok"] else 1, time.perf_counter() - t0, "env.json", info.get("note", info.get("error", "")))
    if args.step in ("all", "verifier"):
        t0 = time.perf_counter()
        modes = args.modes.split(",") if args.modes else None
        try:
            res = check_verifier(args.target, device, args.dtype, args.prompts, args.new_tokens, args.repeats, modes,
                                 progress=lambda r: (out / "verifier.json").write_text(json.dumps(r, indent=2, default=str)))
        except Exception as e:  # noqa: BLE001
            res = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            log(res["error"])
        (out / "verifier.json").write_text(json.dumps(res, indent=2, default=str))
        if not res["ok"]:
            rc = 1
        if in_process:
            note = ", ".join(f"{m}: greedy {'==' if e.get('greedy_equal') else '!='} HF"
                             for m, e in res.get("modes", {}).items()) or res.get("error", "")
            record_step(out, "verifier", "pass" if res["ok"] else "fail", 0 if res["ok"] else 1,
                        time.perf_counter() - t0, "verifier.json", note)
    if args.step in ("all", "summary"):
        ok, md = write_summary(out)
        print(md, flush=True)
        if not ok:
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
