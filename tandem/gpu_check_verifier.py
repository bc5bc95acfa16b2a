"""The GPU check's ``verifier`` step: greedy decoding through the verifier equals HF ``generate``, and its timings.

The target is loaded with ``Target.load(spec, dtype=, device=)`` once per GEMM path: eager (``gemm="mkl"``, plain
transformers) first, when ``Target`` takes a ``gemm`` argument, so that HF ``generate`` greedy on its model is an
independent reference; then the default (fast) path. On each path a few prompts are decoded through ``start`` and
``verify`` with empty drafts (plain steps) and compared with that reference token by token; the reference is also
verified in blocks of k = 1, 4, 7 drafts (a drafter that is always right: every block must be accepted whole); a
plain step and verify blocks of width 1..8 are timed. This is the check that a GPU build decodes exactly what the
CPU-tested code does, and what a verify round costs there. The result is ``verifier.json``'s dict.
"""

from __future__ import annotations

import inspect
import statistics
import time
import traceback

from tandem.gpu_check_steps import is_cuda, log

TEXT_PROMPTS = (
    "Write a haiku about autumn.",
    "Explain what a KV cache is in two sentences.",
    "Translate to German: The weather is nice today.",
    "def fibonacci(n):",
)
WIDTHS = tuple(range(1, 9))


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
