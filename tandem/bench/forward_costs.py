"""Target forward cost per block width, the verifier's memory, and exact rows, for any target the verifier loads.

    python -m tandem.bench.forward_costs --target PATH.gguf --threads 1 --widths 1,2,4,8

Loads the target as the verifier does (``Target.load``: a GGUF file on the fast path, else transformers) with
its warm-up, and reports the process's peak resident memory then (VmHWM, against the file's size). Then, for
each configuration, ms per forward of each width (min and median over repeats, after a ``--context``-token
prefill), the prefill itself, and whether each row of a block is bit-identical to the plain step of its
token (row i of width w == row i of the widest block):
  * decoder        the verifier's path (``Target.decoder``: the C kernels on a GGUF file's blocks, or the
                   decoder over a Hugging Face model's fp32 weights);
  * decoder, greedy rows  the decoder as a greedy session's rows run it (only each row's argmax read: the
                   head's bound pass at the widths the verifier chose at load, ``verifier_service.greedy_head``;
                   shown where it chose any): checked for the decoder's argmax at every width;
  * decoder-torch  the same weights with the torch op backend (the readable reference);
  * transformers   (``--reference``) transformers' forward of the same model, fp32 (a GGUF file
                   dequantized whole): the max |logit| difference against it is reported too.
Every configuration runs in turn within each repeat, so a change in load hits all alike. Also the
memory-bandwidth floor: bytes of the linear weights / measured read bandwidth.

``--sessions 4,8``: the verifier's forward as several clients share it, n sessions of one row each (each
over its own cache, as ``Decoder.forward_blocks`` batches them), beside one session's block of n rows timed
in the same repeat: the rows are as many, but each session's attention reads its own cache. Each session's
row is checked bit-identical to its plain step alone.
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


def peak_rss_mb() -> float:
    """VmHWM of this process (MB), or the peak ru_maxrss where /proc is absent."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Run:
    """One configuration: a new cache, feed ids -> logits [n, V], crop the last w."""

    def __init__(self, new_cache, feed):
        self.new_cache, self.feed = new_cache, feed

    @staticmethod
    def crop(cache, w):
        cache.crop(-w)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="default", help="model spec: 'default', a .gguf file or a Hugging Face directory")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--widths", default="1,2,4,8", help="block widths, comma-separated")
    p.add_argument("--context", type=int, default=300, help="cached tokens before each timed forward")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--activations", default=None, choices=("fp32", "int8", "auto"),
                   help="the C kernels' arithmetic on GGUF blocks, as the verifier's --activations (default: "
                        "TANDEM_ACTIVATIONS, else auto, the verifier's default)")
    p.add_argument("--sessions", default="", help="also time n sessions x 1 row against 1 session x n rows, for "
                   "each n of this comma-separated list (the decoder only)")
    p.add_argument("--reference", action="store_true", help="also time transformers' forward of the same model "
                   "(fp32: a GGUF file dequantized whole, several times the file's memory)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["TANDEM_ACTIVATIONS"] = args.activations or os.environ.get("TANDEM_ACTIVATIONS") or "auto"

    from verifier_service import torch_thread

    # Everything on the verifier's torch thread, as the verifier runs it: forwards from a second thread
    # would give the process two OpenMP teams, and with more OpenMP threads than CPUs libgomp sleeps
    # between parallel regions (verifier_service/torch_thread.py): 2 threads then time slower than 1.
    return torch_thread.run(_measure, args)


def _measure(args) -> int:
    import torch

    from verifier_service.target import Target

    torch.set_num_threads(args.threads)
    widths = sorted({int(w) for w in args.widths.split(",") if w.strip()})
    target = Target.load(args.target, widths=widths)
    rss = peak_rss_mb()
    size_mb = target.gguf.size / 1e6 if target.gguf is not None else 0.0
    decoder = target.decoder
    runs = {}
    if decoder is not None:
        runs["decoder"] = Run(decoder.new_cache, lambda c, ids, last=False: decoder.forward(c, ids, last))
        if decoder.greedy_widths:             # what a greedy session's rows cost (verifier_service.greedy_head)
            runs["decoder, greedy rows"] = Run(decoder.new_cache,
                                               lambda c, ids, last=False: decoder.forward(c, ids, last, True))
        if target.gguf is not None:
            reference_decoder = target.gguf.decoder(native_ops=False, widths=widths)
        else:
            from verifier_service.static_decoder import StaticDecoder

            reference_decoder = StaticDecoder(target.model, gemm=decoder.gemm if decoder.gemm != "auto" else "onednn",
                                              native_ops=False)
        runs["decoder-torch"] = Run(reference_decoder.new_cache,
                                    lambda c, ids, last=False: reference_decoder.forward(c, ids, last))
        weight_bytes = decoder.weights.nbytes()
    else:
        weight_bytes = sum(p_.numel() * p_.element_size() for p_ in target.model.parameters())
    if args.reference or decoder is None:
        from transformers import DynamicCache

        model = target.model

        def feed(cache, ids, last=False):
            return model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True,
                         logits_to_keep=1 if last else 0).logits[0].float()

        runs["transformers"] = Run(lambda: DynamicCache(config=model.config), feed)
    bw = read_bandwidth_gbs(torch)
    floor_ms = weight_bytes / (bw * 1e9) * 1e3
    n_ctx = max(1, min(args.context, target.info.max_context - widths[-1] - 1))
    ids = [(7 * i + 3) % target.vocab_size for i in range(n_ctx + widths[-1])]
    configs = list(runs)
    fwd = {(c, w): [] for c in configs for w in widths}
    prefill = {c: [] for c in configs}
    logits = {}
    with torch.inference_mode():
        for rep in range(args.repeats + 1):                   # repeat 0: warm-up, not recorded
            for c in configs[rep % len(configs):] + configs[:rep % len(configs)]:
                run = runs[c]
                cache = run.new_cache()
                t = _timed(lambda: run.feed(cache, ids[:n_ctx], True))
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

    shared = _sessions(decoder, args, n_ctx) if decoder is not None and args.sessions else None

    def cell(xs):
        return f"{min(xs):.1f} / {statistics.median(xs):.1f}"

    print(f"# Target forward cost per block width: {target.info.model_name}")
    print(f"- {target.startup_line()}")
    print(f"- CPU: {cpu_model()} ({os.cpu_count()} logical CPUs), torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s); context {n_ctx} cached tokens; {args.repeats} repeats, "
          f"configurations interleaved; cells: min / median ms")
    if size_mb:
        print(f"- verifier peak RSS after loading + warm-up: {rss:.0f} MB for a {size_mb:.0f} MB file "
              f"({rss / size_mb:.2f}x; limit 1.25 x file + 300 MB = {1.25 * size_mb + 300:.0f} MB)")
    else:
        print(f"- verifier peak RSS after loading + warm-up: {rss:.0f} MB")
    print(f"- weights {weight_bytes / 2**20:.0f} MiB; read bandwidth {bw:.1f} GB/s -> floor {floor_ms:.1f} ms per "
          "forward (every weight read once)")
    print(f"- prefill of {n_ctx} tokens: " + ", ".join(f"{c} {cell(prefill[c])} ms "
                                                       f"({n_ctx / min(prefill[c]) * 1e3:.0f} tok/s)" for c in configs))
    print()
    print("| width | floor | " + " | ".join(configs) + " |")
    print("|---|---|" + "---|" * len(configs))
    for w in widths:
        print(f"| {w} | {floor_ms:.1f} | " + " | ".join(cell(fwd[(c, w)]) for c in configs) + " |")
    print()
    top = widths[-1]
    bitwise = {c: all(torch.equal(logits[(c, w)], logits[(c, top)][:w]) for w in widths) for c in configs
               if c != "decoder, greedy rows"}
    if "decoder, greedy rows" in runs:          # its rows hold -inf where a logit cannot win: compare the argmax
        bitwise["decoder, greedy rows (argmax)"] = all(
            torch.equal(logits[("decoder, greedy rows", w)].argmax(-1), logits[("decoder", w)].argmax(-1))
            for w in widths)
    if "transformers" in runs and len(configs) > 1:
        diffs = {c: max(float((logits[(c, w)] - logits[("transformers", w)]).abs().max()) for w in widths)
                 for c in configs if c != "transformers"}
        print("- max |logit| difference against transformers: " + ", ".join(f"{c} {d:.2e}" for c, d in diffs.items()))
    print(f"- rows bit-identical across widths (row i of width w == row i of width {top}): "
          + ", ".join(f"{c} {b}" for c, b in bitwise.items()))
    if shared is not None:
        times, identical = shared
        print()
        print("| sessions | n sessions x 1 row | 1 session x n rows | ratio of medians |")
        print("|---|---|---|---|")
        for n, (many, one) in times.items():
            print(f"| {n} | {cell(many)} | {cell(one)} | {statistics.median(many) / statistics.median(one):.2f}x |")
        print()
        print(f"- each session's row in a shared forward bit-identical to its plain step alone: {identical}")
    return 0


def _sessions(decoder, args, n_ctx: int):
    """({n: (ms of n sessions x 1 row, ms of 1 session x n rows)}, every shared row == its plain step alone),
    the two timed in turn in each repeat; the caches hold n_ctx + 3 s tokens (session s: its own text)."""
    import torch

    counts = sorted({int(n) for n in args.sessions.split(",") if n.strip()})
    vocab = decoder.spec.vocab
    ids = [(7 * i + 3) % vocab for i in range(n_ctx + 4 * max(counts) + 4)]   # as _measure's, long enough
    caches = []
    for s in range(max(counts)):
        cache = decoder.new_cache()
        decoder.forward(cache, [(x + 11 * s) % vocab for x in ids[:n_ctx + 3 * s]], True)
        caches.append(cache)
    alone = []
    for s, cache in enumerate(caches):
        alone.append(decoder.forward(cache, [ids[n_ctx + s % 4]]).clone())
        cache.crop(-1)
    times = {n: ([], []) for n in counts}
    identical = True
    with torch.inference_mode():
        for rep in range(args.repeats + 1):
            for n in counts:
                blocks = [(caches[s], [ids[n_ctx + s % 4]]) for s in range(n)]
                t0 = time.perf_counter()
                out = decoder.forward_blocks(blocks)
                many = (time.perf_counter() - t0) * 1e3
                for s in range(n):
                    caches[s].crop(-1)
                    identical = identical and torch.equal(out[s], alone[s])
                t0 = time.perf_counter()
                decoder.forward(caches[0], ids[n_ctx:n_ctx + n])
                one = (time.perf_counter() - t0) * 1e3
                caches[0].crop(-n)
                if rep:
                    times[n][0].append(many)
                    times[n][1].append(one)
    return times, identical


if __name__ == "__main__":
    sys.exit(main())
