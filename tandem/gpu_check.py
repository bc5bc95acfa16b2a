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
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

STEPS_FILE = "steps.tsv"
STATUSES = ("pass", "fail", "skip", "timeout")
TEXT_PROMPTS = (
    "Write a haiku about autumn.",
    "Explain what a KV cache is in two sentences.",
    "Translate to German: The weather is nice today.",
    "def fibonacci(n):",
)
WIDTHS = tuple(range(1, 9))


def log(msg: str) -> None:
    print(f"[gpu-check] {msg}", file=sys.stderr, flush=True)


def is_cuda(device: str) -> bool:
    return str(device).lower().startswith("cuda")


# ---- steps.tsv ----------------------------------------------------------------------------------------------
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


# ---- env ----------------------------------------------------------------------------------------------------
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


# ---- verifier -----------------------------------------------------------------------------------------------
def target_gemm_modes() -> list[str]:
    """[default] plus 'mkl' (eager, plain transformers) when this Target takes a ``gemm`` argument."""
    from verifier_service.target import Target

    params = inspect.signature(Target.__init__).parameters
    if "gemm" not in params:
        return ["default"]
    return ["default", "mkl"]


def make_prompts(tokenizer, vocab_size: int, n: int) -> list[list[int]]:
    """Chat-templated text prompts for a real tokenizer; deterministic id sequences for tiny test vocabularies."""
    prompts: list[list[int]] = []
    if vocab_size >= 1000:
        for text in TEXT_PROMPTS[:n]:
            ids = None
            if getattr(tokenizer, "chat_template", None):
                try:
                    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                             add_generation_prompt=True, tokenize=False)
                    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
                except Exception:  # noqa: BLE001 - fall back to the plain text
                    ids = None
            if not ids:
                ids = tokenizer(text)["input_ids"]
            prompts.append([int(i) for i in ids])
    while len(prompts) < n:
        j = len(prompts)
        prompts.append([1] + [(5 * j + 7 * i + 3) % (vocab_size - 3) + 3 for i in range(6 + 3 * j)])
    return prompts


def hf_greedy(model, prompt: list[int], n: int, pad_id: int) -> list[int]:
    import torch

    dev = next(model.parameters()).device
    with torch.inference_mode():
        ids = torch.tensor([prompt], device=dev)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, eos_token_id=None, pad_token_id=pad_id)
    return out[0, len(prompt):].tolist()


def verifier_greedy(target, sid: str, prompt: list[int], n: int) -> list[int]:
    from tandem.types import SamplingParams

    first, _ = target.start(sid, prompt, SamplingParams())
    toks = [int(first)]
    try:
        while len(toks) < n:
            toks.append(int(target.verify(sid, []).next_token))
    finally:
        target.end(sid)
    return toks


def block_agreement(target, sid: str, prompt: list[int], ref: list[int], k: int) -> dict:
    """Verifies the reference continuation in blocks of k drafts (a drafter that is always right): every block
    must be accepted whole and its bonus token be the reference's next one."""
    from tandem.types import DraftToken, SamplingParams

    first, _ = target.start(sid, prompt, SamplingParams())
    got = [int(first)]
    rounds = full = 0
    try:
        while len(got) + k + 1 <= len(ref):
            draft = [DraftToken(t) for t in ref[len(got):len(got) + k]]
            o = target.verify(sid, draft)
            rounds += 1
            full += int(o.accepted == k)
            got.extend(ref[len(got):len(got) + o.accepted])
            got.append(int(o.next_token))
            if got != ref[:len(got)]:
                break
    finally:
        target.end(sid)
    return {"k": k, "rounds": rounds, "full_blocks": full, "agrees": got == ref[:len(got)], "tokens": len(got)}


def time_widths(target, prompt: list[int], widths=WIDTHS, repeats: int = 5) -> dict:
    """Median ms of verify() at each block width (k = width - 1 arbitrary draft tokens), widths interleaved."""
    from tandem.types import DraftToken, SamplingParams

    v = target.vocab_size
    sid = "__gpu_check_timing__"
    samples: dict[int, list[float]] = {w: [] for w in widths}
    budget = target.info.max_context - len(prompt) - 2

    def fresh():
        target.end(sid)
        target.start(sid, prompt, SamplingParams())
        return 0

    used = fresh()
    for w in widths:                                 # one untimed round (kernels, allocator)
        target.verify(sid, [DraftToken((7 * i + 3) % v) for i in range(w - 1)])
        used += w
    for r in range(repeats):
        for w in widths:
            if used + w > budget:
                used = fresh()
            draft = [DraftToken((11 * r + 7 * i + 5) % v) for i in range(w - 1)]
            t0 = time.perf_counter()
            o = target.verify(sid, draft)
            samples[w].append((time.perf_counter() - t0) * 1e3)
            used += 1 + o.accepted
    target.end(sid)
    return {str(w): round(statistics.median(s), 3) for w, s in samples.items() if s}


def check_verifier(spec: str, device: str, dtype: str = "float32", n_prompts: int = 3, new_tokens: int = 32,
                   repeats: int = 5, modes: list[str] | None = None, progress=None) -> dict:
    """Greedy through the verifier == HF generate, per GEMM mode; timings. Returns the verifier.json dict;
    ``progress(result so far)`` is called after each mode (so a step killed by its time limit keeps what it did)."""
    import gc

    import torch

    from verifier_service.target import Target

    modes = modes or target_gemm_modes()
    result: dict = {"target": spec, "device": device, "dtype": dtype, "new_tokens": new_tokens,
                    "modes": {}, "gemm_switch": "gemm" in inspect.signature(Target.__init__).parameters}
    if not result["gemm_switch"]:
        log("Target has no gemm= argument: only its default path is checked")
    reference: list[list[int]] | None = None
    prompts: list[list[int]] | None = None
    # eager first: its model is plain transformers, so HF generate on it is the independent reference
    order = sorted(modes, key=lambda m: m != "mkl")
    for mode in order:
        t0 = time.perf_counter()
        kw = {} if mode == "default" else {"gemm": mode}
        entry: dict = {"gemm_asked": mode}
        try:
            target = Target.load(spec, dtype=dtype, device=device, **kw)
            entry["load_s"] = round(time.perf_counter() - t0, 2)
            entry["gemm_in_use"] = getattr(target, "gemm", None)
            entry["gemm_note"] = getattr(target, "gemm_note", None)
            entry["device_in_use"] = str(target.device)
            entry["cost_table_ms"] = {str(k): round(v, 3) for k, v in target.cost_table().items()}
            if prompts is None:
                prompts = make_prompts(target.tokenizer, target.vocab_size, n_prompts)
                pad = target.tokenizer.pad_token_id
                pad = int(pad if pad is not None else (target.info.eos_token_ids or (0,))[0])
                if mode != "mkl" and result["gemm_switch"]:
                    log("warning: the HF reference is computed on the default path's model")
                reference = [hf_greedy(target.model, p, new_tokens, pad) for p in prompts]
                result["prompt_lengths"] = [len(p) for p in prompts]
                result["hf_reference"] = reference
            per_prompt = []
            for i, (p, ref) in enumerate(zip(prompts, reference)):
                got = verifier_greedy(target, f"gpu-check-{mode}-{i}", p, new_tokens)
                first_diff = next((j for j, (a, b) in enumerate(zip(got, ref)) if a != b), None)
                per_prompt.append({"prompt": i, "equal": got == ref, "first_difference": first_diff,
                                   "tokens": got})
            entry["greedy"] = per_prompt
            entry["greedy_equal"] = all(p["equal"] for p in per_prompt)
            entry["block_verify"] = [block_agreement(target, f"gpu-check-blk-{mode}-{k}", prompts[0], reference[0], k)
                                     for k in (1, 4, 7)]
            entry["verify_ms_by_width"] = time_widths(target, prompts[0], repeats=repeats)
            entry["plain_step_ms"] = entry["verify_ms_by_width"].get("1")
            entry["ok"] = entry["greedy_equal"]
            del target
        except Exception as e:  # noqa: BLE001 - record, go on with the next mode
            entry["ok"] = False
            entry["error"] = f"{type(e).__name__}: {e}"
            entry["traceback"] = traceback.format_exc()
            log(f"mode {mode}: {entry['error']}")
        entry["seconds"] = round(time.perf_counter() - t0, 2)
        result["modes"][mode] = entry
        gc.collect()
        if is_cuda(device) and torch.cuda.is_available():
            torch.cuda.empty_cache()
            result.setdefault("cuda_max_memory_mib", {})[mode] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        log(f"mode {mode}: greedy == HF generate: {entry.get('greedy_equal')}  plain step "
            f"{entry.get('plain_step_ms')} ms  ({entry['seconds']} s)")
        if progress is not None:
            progress(dict(result, ok=False, partial=True))
    result["ok"] = bool(result["modes"]) and all(m["ok"] for m in result["modes"].values())
    return result


# ---- summary ------------------------------------------------------------------------------------------------
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


# ---- the command --------------------------------------------------------------------------------------------
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
