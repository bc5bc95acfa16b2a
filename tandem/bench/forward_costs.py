"""Target forward cost per block width: HF eager (MKL) against the verifier's fast paths, interleaved.

    python -m tandem.bench.forward_costs --threads 1 --widths 1,2,3,5,8,16

Prints, for the target (default: the default target) on this machine: the CPU model, the memory-bandwidth
floor (bytes of the linear weights / measured read bandwidth), and ms per width (min and median over
repeats, after a ``--context``-token prefill) for
  * eager    transformers as loaded (nn.Linear -> F.linear -> MKL, sdpa attention);
  * hf-fast  transformers' forward with oneDNN on packed weights + row-wise attention (the verifier's
             path for models the static decoder cannot run; its Llama path before the static decoder);
  * static-torch  ``verifier_service.static_decoder`` with oneDNN, exact rows, torch ops for attention and glue;
  * static   the same with the C attention and glue (``verifier_service.native``);
  * static-gguf  the same on the GGUF file's blocks (``gguf_linear``; the Target default for a Q4_1 GGUF
             target where the C kernels build);
  * static-batched  static with a block's rows in one SDPA call (``--exact-rows off``);
  * gemm-mkl / gemm-onednn  the model's linear layers alone, once each;
every configuration measured in turn within each repeat, so a change in load hits all alike. Also the
max |logit| difference against eager and whether each path's rows are bit-identical across widths.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown"


def read_bandwidth_gbs(torch, mib: int = 512, repeats: int = 5) -> float:
    """GB/s reading a ``mib`` MiB fp32 buffer once (far beyond the caches), the best of three readers
    (sum, dot, matrix-vector product) and ``repeats`` tries each."""
    x = torch.ones(mib * 2**20 // 4)
    m = x.view(-1, 1024)
    v = torch.ones(1024)
    readers = [lambda: x.sum(), lambda: torch.dot(x, x), lambda: torch.mv(m, v)]
    for r in readers:
        r()
    best = min(_timed(r) for r in readers for _ in range(repeats))
    return x.numel() * 4 / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


OP_CLASSES = ("linear GEMMs", "attention", "norms + activations", "rotary + copies + cache")


def _op_class(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("linear", "aten::mm", "addmm", "matmul", "mkldnn")):
        return "linear GEMMs"
    if any(k in n for k in ("attention", "softmax", "rowwise", "bmm")):
        return "attention"
    if any(k in n for k in ("norm", "rsqrt", "pow", "mean", "silu", "sigmoid")):
        return "norms + activations"
    if any(k in n for k in ("cat", "copy", "index", "slice", "transpose", "view", "cos", "sin", "narrow", "select",
                            "expand", "clone", "contiguous", "reshape")):
        return "rotary + copies + cache"
    return "other"


def profile_by_class(run, ids, n_ctx: int, width: int) -> dict[str, float]:
    """Self CPU ms by op class of one forward of ``width`` positions after ``n_ctx`` cached tokens
    (``run``: a configuration of ``main``: cache(), feed(cache, ids, last_only), crop(cache, w))."""
    import statistics

    import torch
    from torch.profiler import ProfilerActivity, profile

    runs = []
    with torch.inference_mode():
        cache = run.cache()
        run.feed(cache, ids[:n_ctx], last_only=True)
        for _ in range(4):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                run.feed(cache, ids[n_ctx:n_ctx + width])
            run.crop(cache, width)
            by = {}
            for ev in prof.key_averages():
                by[_op_class(ev.key)] = by.get(_op_class(ev.key), 0.0) + ev.self_cpu_time_total / 1e3
            runs.append(by)
    runs = runs[1:]
    return {k: statistics.median(r.get(k, 0.0) for r in runs) for k in set().union(*runs)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="default", help="model spec (default: the default target)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--widths", default="1,2,3,5,8,16", help="block widths, comma-separated")
    p.add_argument("--context", type=int, default=300, help="cached tokens before each timed forward")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--profile", type=int, default=0, help="also profile one forward of this block width, eager, "
                   "hf-fast and static-torch, and print where its time goes by op class (torch profiler, self CPU "
                   "time; the C kernels of static and static-gguf are invisible to it)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch
    from transformers import DynamicCache

    from tandem.models import load_causal_lm
    from verifier_service import fast_linear as fl
    from verifier_service.forward import use_rowwise_attention
    from verifier_service.static_decoder import StaticDecoder

    torch.set_num_threads(args.threads)
    widths = sorted({int(w) for w in args.widths.split(",") if w.strip()})
    model, _tok, loc = load_causal_lm(args.target)
    if not fl.onednn_available():
        print("oneDNN linears are not available in this torch build: nothing to compare", file=sys.stderr)
        return 2
    weights = fl.linear_weights(model)
    wbytes = sum(w.numel() * w.element_size() + (0 if b is None else b.numel() * b.element_size()) for w, b in weights)
    bw = read_bandwidth_gbs(torch)
    floor_ms = wbytes / (bw * 1e9) * 1e3

    # configurations: swap the same FastLinear objects in and out (no re-packing between repeats)
    fl.install(model, {}, fl.ONEDNN)
    fast_modules = {n: m for n, m in model.named_modules() if isinstance(m, fl.FastLinear)}
    plain_modules = {n: m.to_linear() for n, m in fast_modules.items()}
    packed = [m.packed for m in fast_modules.values()]

    def configure(name):
        mods = fast_modules if name == "hf-fast" else plain_modules
        for n, m in mods.items():
            fl._set_child(model, n, m)
        use_rowwise_attention(model, name == "hf-fast")

    configure("eager")
    static_torch = StaticDecoder(model, gemm=fl.ONEDNN, native_ops=False)   # the model's own weights, packed again
    static = StaticDecoder(model, gemm=fl.ONEDNN)
    static_batched = StaticDecoder(model, gemm=fl.ONEDNN, exact_rows=False)
    from verifier_service import native

    static_gguf = None
    if loc.gguf_file and native.library() is not None:
        try:
            static_gguf = StaticDecoder(model, gemm="gguf", gguf_path=str(loc.directory / loc.gguf_file))
        except ValueError as e:
            print(f"static-gguf not measured: {e}", file=sys.stderr)
    else:
        print(f"static-gguf not measured: {native.unavailable_reason() or 'the target is not a GGUF file'}",
              file=sys.stderr)

    class HF:                       # (new cache, feed ids -> logits [n, V], crop the last w) per configuration
        def __init__(self, name):
            self.name = name

        def cache(self):
            configure(self.name)
            return DynamicCache(config=model.config)

        def feed(self, cache, ids_, last_only=False):
            return model(input_ids=torch.tensor([ids_]), cache=cache, use_cache=True,
                         logits_to_keep=1 if last_only else 0).logits[0]

        @staticmethod
        def crop(cache, w):
            cache.crop(-w)

    class Static:
        def __init__(self, decoder):
            self.decoder = decoder

        def cache(self):
            return self.decoder.new_cache()

        def feed(self, cache, ids_, last_only=False):
            return self.decoder.forward(cache, ids_, last_only)

        @staticmethod
        def crop(cache, w):
            cache.crop(-w)

    runners = {"eager": HF("eager"), "hf-fast": HF("hf-fast"), "static-torch": Static(static_torch),
               "static": Static(static), "static-batched": Static(static_batched)}
    if static_gguf is not None:
        runners["static-gguf"] = Static(static_gguf)
    n_ctx = max(1, min(args.context, int(getattr(model.config, "max_position_embeddings", 2048)) - widths[-1] - 1))
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = [(7 * i + 3) % vocab for i in range(n_ctx + widths[-1])]
    configs = list(runners)
    fwd = {(c, w): [] for c in configs for w in widths}
    prefill = {c: [] for c in configs}
    kernels = fl.KERNELS + (("gguf",) if static_gguf is not None else ())
    gemm = {(k, w): [] for k in kernels for w in widths}
    gen = torch.Generator().manual_seed(0)
    inputs = {(r, k): torch.randn(r, k, generator=gen) for r in widths for k in {w.shape[1] for w, _ in weights}}
    logits = {}
    with torch.inference_mode():
        for rep in range(args.repeats + 1):                   # repeat 0: warm-up, not recorded
            for c in configs[rep % len(configs):] + configs[:rep % len(configs)]:
                run = runners[c]
                cache = run.cache()
                t = _timed(lambda: run.feed(cache, ids[:n_ctx], last_only=True))
                if rep:
                    prefill[c].append(t * 1e3)
                for w in widths:
                    t0 = time.perf_counter()
                    out = run.feed(cache, ids[n_ctx:n_ctx + w])
                    dt = (time.perf_counter() - t0) * 1e3
                    run.crop(cache, w)
                    if rep:
                        fwd[(c, w)].append(dt)
                    else:
                        logits[(c, w)] = out.clone()
            for w in widths:
                for k in fl.KERNELS:
                    dt = fl.time_gemms(weights, packed, k, w, inputs)
                    if rep:
                        gemm[(k, w)].append(dt)
                if static_gguf is not None and rep:
                    gemm[("gguf", w)].append(static_gguf.time_linears([w], repeats=1)[w])
    configure("eager")

    def cell(xs):
        return f"{min(xs):.1f} / {statistics.median(xs):.1f}"

    print(f"# Target forward cost per block width: {loc.name}")
    print(f"- CPU: {cpu_model()} ({os.cpu_count()} logical CPUs), torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s); context {n_ctx} cached tokens; {args.repeats} repeats, "
          f"configurations interleaved; cells: min / median ms")
    print(f"- linear weights {wbytes / 2**20:.0f} MiB; read bandwidth {bw:.1f} GB/s -> floor {floor_ms:.1f} ms "
          "per forward (every weight read once)")
    print(f"- prefill of {n_ctx} tokens: " + ", ".join(f"{c} {cell(prefill[c])}" for c in configs))
    print()
    names = {"eager": "eager (MKL)"}
    print("| width | floor | " + " | ".join(names.get(c, c) for c in configs) + " | "
          + " | ".join(f"GEMMs {k}" for k in kernels) + " | spread eager / static |")
    print("|---|---|" + "---|" * (len(configs) + len(kernels) + 1))
    for w in widths:
        spread = " / ".join(f"{(max(fwd[(c, w)]) - min(fwd[(c, w)])) / statistics.median(fwd[(c, w)]) * 100:.0f}%"
                            for c in ("eager", "static"))
        print(f"| {w} | {floor_ms:.1f} | " + " | ".join(cell(fwd[(c, w)]) for c in configs)
              + " | " + " | ".join(cell(gemm[(k, w)]) for k in kernels) + f" | {spread} |")
    print()
    top = widths[-1]
    diffs = {c: max(float((logits[(c, w)] - logits[("eager", w)]).abs().max()) for w in widths) for c in configs[1:]}
    bitwise = {c: all(torch.equal(logits[(c, w)], logits[(c, top)][:w]) for w in widths) for c in configs}
    if args.profile:
        print()
        print(f"Where one forward of width {args.profile} goes (self CPU ms, torch profiler, median of 3):")
        print()
        # the C kernels (static, static-gguf) are invisible to torch's profiler: their wall times are above
        profiled = ["eager", "hf-fast", "static-torch"]
        print("| op class | " + " | ".join(names.get(c, c) for c in profiled) + " |")
        print("|---|" + "---|" * len(profiled))
        rows = {c: profile_by_class(runners[c], ids, n_ctx, args.profile) for c in profiled}
        for cls in OP_CLASSES + ("other",):
            print(f"| {cls} | " + " | ".join(f"{rows[c].get(cls, 0.0):.1f}" for c in rows) + " |")
        print("| total | " + " | ".join(f"{sum(rows[c].values()):.1f}" for c in rows) + " |")
    print("- max |logit| difference against eager: " + ", ".join(f"{c} {d:.2e}" for c, d in diffs.items()))
    print(f"- rows bit-identical across widths (row i of width w == row i of width {top}): "
          + ", ".join(f"{c} {b}" for c, b in bitwise.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
