"""Target forward cost per block width: HF eager (MKL) against the verifier's fast path, interleaved.

    python -m tandem.bench.forward_costs --threads 1 --widths 1,2,3,5,8,16

Prints, for the target (default: the default target) on this machine: the CPU model, the memory-bandwidth
floor (bytes of the linear weights / measured read bandwidth), and ms per width (min and median over
repeats, after a ``--context``-token prefill) for
  * eager    transformers as loaded (nn.Linear -> F.linear -> MKL, sdpa attention);
  * fast     verifier_service's path: oneDNN on packed weights + row-wise attention (the Target default
             when oneDNN wins);
  * fast-sdpa the same GEMMs with transformers' sdpa attention (shows what the row-wise attention costs);
  * gemm-mkl / gemm-onednn  the model's linear layers alone, once each;
every configuration measured in turn within each repeat, so a change in load hits all alike. Also the
max |logit| difference fast vs eager and whether the fast path's rows are bit-identical across widths.
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
    if any(k in n for k in ("linear", "aten::mm", "addmm", "matmul", "aten::bmm", "mkldnn")):
        return "linear GEMMs"
    if any(k in n for k in ("attention", "softmax", "rowwise")):
        return "attention"
    if any(k in n for k in ("norm", "rsqrt", "pow", "mean", "silu", "sigmoid")):
        return "norms + activations"
    if any(k in n for k in ("cat", "copy", "index", "slice", "transpose", "view", "cos", "sin", "narrow", "select",
                            "expand", "clone", "contiguous", "reshape")):
        return "rotary + copies + cache"
    return "other"


def profile_by_class(model, configure, config: str, ids, n_ctx: int, width: int) -> dict[str, float]:
    """Self CPU ms by op class of one forward of ``width`` positions after ``n_ctx`` cached tokens."""
    import statistics

    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import DynamicCache

    configure(config)
    runs = []
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :n_ctx], cache=cache, use_cache=True, logits_to_keep=1)
        for _ in range(4):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                model(input_ids=ids[:, n_ctx:n_ctx + width], cache=cache, use_cache=True)
            cache.crop(-width)
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
    p.add_argument("--profile", type=int, default=0, help="also profile one forward of this block width, eager and "
                   "fast, and print where its time goes by op class (torch profiler, self CPU time)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch
    from transformers import DynamicCache

    from tandem.models import load_causal_lm
    from verifier_service import fast_linear as fl
    from verifier_service.forward import use_rowwise_attention

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

    def configure(name):
        mods = plain_modules if name == "eager" else fast_modules
        for n, m in mods.items():
            fl._set_child(model, n, m)
        use_rowwise_attention(model, name == "fast")

    n_ctx = max(1, min(args.context, int(getattr(model.config, "max_position_embeddings", 2048)) - widths[-1] - 1))
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = torch.tensor([[(7 * i + 3) % vocab for i in range(n_ctx + widths[-1])]])
    configs = ["eager", "fast", "fast-sdpa"]
    fwd = {(c, w): [] for c in configs for w in widths}
    prefill = {c: [] for c in configs}
    gemm = {(k, w): [] for k in fl.KERNELS for w in widths}
    packed = [m.packed for m in fast_modules.values()]
    gen = torch.Generator().manual_seed(0)
    inputs = {(r, k): torch.randn(r, k, generator=gen) for r in widths for k in {w.shape[1] for w, _ in weights}}
    logits = {}
    with torch.inference_mode():
        for rep in range(args.repeats + 1):                   # repeat 0: warm-up, not recorded
            for c in configs[rep % len(configs):] + configs[:rep % len(configs)]:
                configure(c)
                cache = DynamicCache(config=model.config)
                t = _timed(lambda: model(input_ids=ids[:, :n_ctx], cache=cache, use_cache=True,
                                         logits_to_keep=1))
                if rep:
                    prefill[c].append(t * 1e3)
                for w in widths:
                    t0 = time.perf_counter()
                    out = model(input_ids=ids[:, n_ctx:n_ctx + w], cache=cache, use_cache=True)
                    dt = (time.perf_counter() - t0) * 1e3
                    cache.crop(-w)
                    if rep:
                        fwd[(c, w)].append(dt)
                    else:
                        logits[(c, w)] = out.logits[0].clone()
            for w in widths:
                for k in fl.KERNELS:
                    dt = fl.time_gemms(weights, packed, k, w, inputs)
                    if rep:
                        gemm[(k, w)].append(dt)

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
    print("| width | floor | eager (MKL) | fast | fast-sdpa | GEMMs MKL | GEMMs oneDNN | spread eager / fast |")
    print("|---|---|---|---|---|---|---|---|")
    for w in widths:
        spread = " / ".join(f"{(max(fwd[(c, w)]) - min(fwd[(c, w)])) / statistics.median(fwd[(c, w)]) * 100:.0f}%"
                            for c in ("eager", "fast"))
        print(f"| {w} | {floor_ms:.1f} | {cell(fwd[('eager', w)])} | {cell(fwd[('fast', w)])} | "
              f"{cell(fwd[('fast-sdpa', w)])} | {cell(gemm[('mkl', w)])} | {cell(gemm[('onednn', w)])} | {spread} |")
    print()
    diff = max(float((logits[("fast", w)] - logits[("eager", w)]).abs().max()) for w in widths)
    top = widths[-1]
    bitwise = all(torch.equal(logits[("fast", w)], logits[("fast", top)][:w]) for w in widths)
    bitwise_sdpa = all(torch.equal(logits[("fast-sdpa", w)], logits[("fast-sdpa", top)][:w]) for w in widths)
    bitwise_eager = all(torch.equal(logits[("eager", w)], logits[("eager", top)][:w]) for w in widths)
    if args.profile:
        print()
        print(f"Where one forward of width {args.profile} goes (self CPU ms, torch profiler, median of 3):")
        print()
        print("| op class | eager (MKL) | fast |")
        print("|---|---|---|")
        rows = {c: profile_by_class(model, configure, c, ids, n_ctx, args.profile) for c in ("eager", "fast")}
        for cls in OP_CLASSES + ("other",):
            print(f"| {cls} | {rows['eager'].get(cls, 0.0):.1f} | {rows['fast'].get(cls, 0.0):.1f} |")
        print(f"| total | {sum(rows['eager'].values()):.1f} | {sum(rows['fast'].values()):.1f} |")
    print(f"- max |logit| difference fast vs eager: {diff:.2e}")
    print(f"- rows bit-identical across widths (row i of width w == row i of width {top}): fast {bitwise}, "
          f"fast-sdpa {bitwise_sdpa}, eager {bitwise_eager}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
