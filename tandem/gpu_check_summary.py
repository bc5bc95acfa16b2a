"""The GPU check's ``summary`` step: ``summary.md`` and ``summary.json`` from what the other steps left in ``--out``.

It reads ``steps.tsv`` (one line a step, from the shell script or the in-process steps), ``plan.json``,
``env.json``, ``verifier.json``, the tests' ``tests.xml`` and the head of the bench's ``report.md``, whichever
exist, and says PASS only when there were steps and none failed or timed out. It imports no torch and nothing
outside the standard library and ``tandem.gpu_check_steps``, so ``deploy/gpu-check.sh`` can run it with a plain
``python3`` even when the install step failed, and the run still ends with its report.
"""

from __future__ import annotations

import json
from pathlib import Path

from tandem.gpu_check_steps import is_cuda, read_steps


def _load(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_summary(out: Path) -> tuple[bool, str]:
    """summary.md + summary.json from what the steps left in ``out``; returns (all passed, markdown)."""
    steps = read_steps(out)
    env = _load(out / "env.json") or {}
    ver = _load(out / "verifier.json") or {}
    plan = _load(out / "plan.json") or {}
    failed = [s for s in steps if s["status"] in ("fail", "timeout")]
    ok = bool(steps) and not failed
    lines = ["# Tandem GPU check", ""]
    device = plan.get("device") or env.get("device_asked") or ver.get("device") or "?"
    lines.append(f"- result: **{'PASS' if ok else 'FAIL'}**" + (f" ({len(failed)} step(s) failed: "
                 + ", ".join(s["name"] for s in failed) + ")" if failed else ""))
    lines.append(f"- device: `{device}`" + ("  (CPU dry run: CUDA-only parts skipped)" if not is_cuda(device) else ""))
    if env.get("gpu_name"):
        lines.append(f"- GPU: {env['gpu_name']} ({env.get('gpu_memory_gib')} GiB, compute capability "
                     f"{env.get('gpu_capability')}, {env.get('gpu_count')} visible)")
    if env.get("nvidia_smi"):
        lines.append(f"- nvidia-smi: {env['nvidia_smi']}")
    if env:
        lines.append(f"- versions: python {env.get('python')}, torch {env.get('torch')} (CUDA {env.get('torch_cuda')},"
                     f" cuDNN {env.get('cudnn', '-')}), transformers {env.get('transformers')}, onnxruntime "
                     f"{env.get('onnxruntime')}, grpc {env.get('grpc')}, gguf {env.get('gguf')}")
        lines.append(f"- CUDA visible to torch: {env.get('cuda_available')}")
    if plan.get("target"):
        lines.append(f"- target: `{plan['target']}`")
    if plan.get("started"):
        lines.append(f"- started {plan['started']} on {plan.get('host', '?')}")
    lines += ["", "## Steps", "", "| step | status | seconds | log | note |", "|---|---|---|---|---|"]
    for s in steps:
        lines.append(f"| {s['name']} | {s['status'].upper() if s['status'] in ('fail', 'timeout') else s['status']} | "
                     f"{s['seconds']:.1f} | {s['log']} | {s['note']} |")
    total = sum(s["seconds"] for s in steps if s["seconds"] == s["seconds"])
    lines.append(f"\nTotal: {total:.0f} s.")
    if ver:
        lines += ["", "## Verifier: greedy through Target.start/verify vs HF generate", "",
                  f"target `{ver.get('target')}`, {ver.get('device')}, {ver.get('dtype')}, "
                  f"{ver.get('new_tokens')} new tokens, prompts of {ver.get('prompt_lengths')} tokens"
                  + ("" if ver.get("gemm_switch") else "; this Target has no gemm= switch (default path only)"),
                  "", "| path | gemm in use | greedy == HF | block verify (k: agrees) | plain step ms | "
                  "verify ms by width 1..8 | load s |", "|---|---|---|---|---|---|---|"]
        for mode, m in ver.get("modes", {}).items():
            name = "fast (default)" if mode == "default" else f"eager (gemm={mode})"
            if "error" in m:
                lines.append(f"| {name} | - | ERROR: {m['error'][:200]} | | | | |")
                continue
            eq = "yes" if m.get("greedy_equal") else "NO: " + ", ".join(
                f"prompt {p['prompt']} from token {p['first_difference']}" for p in m.get("greedy", []) if not p["equal"])
            blk = ", ".join(f"{b['k']}: {'yes' if b['agrees'] else 'no'}" for b in m.get("block_verify", []))
            widths = " / ".join(f"{v:.2f}" for v in m.get("verify_ms_by_width", {}).values())
            lines.append(f"| {name} | {m.get('gemm_in_use')} ({m.get('gemm_note')}) | {eq} | {blk} | "
                         f"{m.get('plain_step_ms')} | {widths} | {m.get('load_s')} |")
        if ver.get("partial"):
            lines.append("\n(partial: the verifier step was stopped before it checked every path)")
        if ver.get("cuda_max_memory_mib"):
            lines.append(f"\nPeak CUDA memory (MiB): {ver['cuda_max_memory_mib']}")
    tests = out / "tests.xml"
    if tests.exists():
        import xml.etree.ElementTree as ET

        try:
            root = ET.parse(tests).getroot()
            suite = root if root.tag == "testsuite" else root.find("testsuite")
            if suite is not None:
                a = suite.attrib
                lines += ["", "## Tests", "", f"{a.get('tests')} tests: {a.get('failures')} failed, {a.get('errors')} "
                          f"errors, {a.get('skipped')} skipped, {float(a.get('time', 0)):.0f} s (tests.log)"]
        except ET.ParseError:
            pass
    bench_report = next(iter(sorted((out / "bench").glob("**/report.md"))), None) if (out / "bench").exists() else None
    if bench_report:
        lines += ["", "## Bench", "", f"report: `{bench_report.relative_to(out)}`; its head:", ""]
        head = [ln for ln in bench_report.read_text(encoding="utf-8").splitlines() if ln.strip()][:14]
        lines += ["> " + ln for ln in head]
    md = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(md, encoding="utf-8")
    (out / "summary.json").write_text(json.dumps({"ok": ok, "device": device, "steps": steps, "env": env,
                                                   "verifier_ok": ver.get("ok")}, indent=2, default=str),
                                      encoding="utf-8")
    return ok, md
