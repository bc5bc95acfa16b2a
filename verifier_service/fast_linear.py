"""A faster fp32 GEMM path for the target's linear layers on CPU, chosen by measurement.

Why: MKL's sgemm (what ``F.linear`` calls) is pathological on some CPUs for the 2-16-row GEMMs of
speculative verification (on some CPUs 2-3 rows cost 1.6-2x one row: BENCHMARKS.md). oneDNN's inner
product with the weight reordered ONCE into its blocked layout (``torch.ops.mkldnn._reorder_linear_weight``,
what Inductor's freezing pass does for CPU linears) runs close to the memory-bandwidth floor at every
width, and is 2x faster for prefill too.

Exact fp32 math either way (same products, another summation order: |diff| ~1e-6 against MKL). With
the reordered weight, oneDNN's result for a row does not depend on how many rows the GEMM has, so a
token's logits are the same in a width-1 plain step and inside a width-(k+1) verify block (see
``tests/unit/test_fast_path.py``): greedy speculative output equals plain decoding bit for bit.

Pieces:
  * ``FastLinear``: drop-in for ``nn.Linear`` (keeps the same ``weight``/``bias`` Parameters, so tied
    embeddings, ``state_dict`` and ``model.parameters()`` are untouched) holding the packed weight and
    dispatching on the input's row count to the chosen kernel ("onednn" or "mkl").
  * ``install(model, choice)`` / ``uninstall(model)``: swap every CPU fp32 ``nn.Linear`` in and out.
  * ``choose_gemm(model, widths, threads)``: times each candidate kernel over all the model's linear
    layers at each width, interleaved, and returns the per-width choice and the cost table.
  * ``configure(model, gemm, widths)``: the whole set-up for a ``--gemm`` mode (what the verifier calls,
    for transformers' modules and for the static decoder's alike).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

MKL = "mkl"          # F.linear: torch's CPU BLAS (MKL in the PyPI wheels)
ONEDNN = "onednn"    # oneDNN inner product on a weight reordered once into oneDNN's blocked layout
KERNELS = (MKL, ONEDNN)
GEMM_MODES = ("auto", MKL, ONEDNN)
# oneDNN keeps a width unless MKL is more than 3% faster there: one kernel at every width keeps a
# row's result independent of the block width, worth more than a few percent of timing noise.
PREFER_MARGIN = 0.97


@functools.cache
def onednn_available() -> bool:
    """True when this torch build can run oneDNN linears on packed fp32 weights (and gets them right)."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        w = torch.randn(8, 16)
        b = torch.randn(8)
        x = torch.randn(3, 16)
        y = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(w), b, "none", [], "")
        return bool(torch.allclose(y, F.linear(x, w, b), atol=1e-4, rtol=1e-4))
    except Exception as e:  # noqa: BLE001 - any failure means "not here"
        log.info("oneDNN linear unavailable: %s", e)
        return False


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """The weight [out, in] reordered into oneDNN's blocked layout (an mkldnn tensor, a copy)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())


def _single_row_differs(weight: torch.Tensor, packed: torch.Tensor) -> bool:
    """oneDNN takes a GEMV path for one row on some shapes (K = 1536 on SmolLM2's down_proj) whose sums
    differ in the last bit from the GEMM path every other row count takes; such layers run one row as two
    (a second, discarded copy: nearly free, the GEMM is memory-bound) so a row never depends on the width."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, weight.shape[1], generator=gen)
    with torch.inference_mode():
        one = run_kernel(ONEDNN, x[:1], weight, packed, None)
        many = run_kernel(ONEDNN, x, weight, packed, None)[:1]
    return not torch.equal(one, many)


def run_kernel(kernel: str, x2d: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None,
               bias: torch.Tensor | None) -> torch.Tensor:
    if kernel == ONEDNN and packed is not None:
        return torch.ops.mkldnn._linear_pointwise(x2d, packed, bias, "none", [], "")
    return F.linear(x2d, weight, bias)


class FastLinear(nn.Module):
    """``nn.Linear`` with a per-row-count kernel choice: rows r use ``kernels[r]`` (rows beyond the table:
    ``default``). Inference only: with autograd recording it falls back to ``F.linear``."""

    def __init__(self, linear: nn.Linear, kernels: Mapping[int, str] | None = None, default: str = ONEDNN):
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight          # the same Parameter objects: tying and state_dict unchanged
        self.bias = linear.bias
        self.packed: torch.Tensor | None = None   # not a buffer: stays out of state_dict / .to()
        self.pad_single = False                   # run 1-row inputs as 2 rows (see _single_row_differs)
        self._by_rows: tuple[str, ...] = ()
        self.default = MKL
        self.set_kernels(kernels or {}, default)

    def set_kernels(self, kernels: Mapping[int, str], default: str) -> None:
        top = max(kernels, default=0)
        by_rows = [default] * (top + 1)
        for rows, kernel in kernels.items():
            by_rows[rows] = kernel
        uses = set(by_rows) | {default}
        if not uses <= set(KERNELS):
            raise ValueError(f"unknown GEMM kernel(s) {sorted(uses - set(KERNELS))}; choose from {KERNELS}")
        if ONEDNN in uses and self.packed is None:
            self.packed = pack_weight(self.weight)
            self.pad_single = _single_row_differs(self.weight, self.packed)
        elif ONEDNN not in uses:
            self.packed = None                    # frees the copy
        self._by_rows, self.default = tuple(by_rows), default

    def kernel_for(self, rows: int) -> str:
        return self._by_rows[rows] if rows < len(self._by_rows) else self.default

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
            return F.linear(x, self.weight, self.bias)
        x2d = x.reshape(-1, self.in_features)
        kernel = self.kernel_for(x2d.shape[0])
        if kernel == ONEDNN and self.pad_single and x2d.shape[0] == 1:
            y = run_kernel(kernel, x2d.expand(2, -1).contiguous(), self.weight, self.packed, self.bias)[:1]
        else:
            y = run_kernel(kernel, x2d, self.weight, self.packed, self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def to_linear(self) -> nn.Linear:
        lin = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        lin.weight = self.weight
        lin.bias = self.bias
        return lin

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"kernels={dict(enumerate(self._by_rows)) if self._by_rows else {}}, default={self.default}")


def _replaceable(module: nn.Module) -> bool:
    return (type(module) is nn.Linear and module.weight.device.type == "cpu"
            and module.weight.dtype == torch.float32)


def _set_child(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def install(model: nn.Module, kernels: Mapping[int, str] | None = None, default: str = ONEDNN) -> int:
    """Replaces every CPU fp32 ``nn.Linear`` of ``model`` by a ``FastLinear`` (or re-sets the kernels of
    those already there); returns how many there are. Needs ``onednn_available()`` when oneDNN is used."""
    kernels = dict(kernels or {})
    if ONEDNN in set(kernels.values()) | {default} and not onednn_available():
        raise RuntimeError("oneDNN linears are not available in this torch build; use gemm='mkl'")
    n = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, FastLinear):
            module.set_kernels(kernels, default)
            n += 1
        elif _replaceable(module):
            _set_child(model, name, FastLinear(module, kernels, default))
            n += 1
    return n


def uninstall(model: nn.Module) -> int:
    """Puts plain ``nn.Linear`` modules back (same Parameters); returns how many."""
    n = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, FastLinear):
            _set_child(model, name, module.to_linear())
            n += 1
    return n


def linear_weights(model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(weight, bias) of every linear layer of ``model`` (plain or FastLinear), in module order."""
    return [(m.weight.detach(), None if m.bias is None else m.bias.detach())
            for m in model.modules() if isinstance(m, (nn.Linear, FastLinear))]


@dataclass
class GemmChoice:
    """The outcome of ``choose_gemm``: the kernel per width, and ms per width per kernel (min over repeats:
    all the model's linear layers once, at that many rows)."""

    choice: dict[int, str]
    table: dict[int, dict[str, float]]
    threads: int
    default: str = ONEDNN                      # kernel for row counts beyond the measured widths
    notes: list[str] = field(default_factory=list)

    @property
    def uniform(self) -> bool:
        """One kernel at every width (then a row's result is independent of the block width)."""
        return len(set(self.choice.values()) | {self.default}) == 1

    def describe(self) -> str:
        rows = [f"w={w}: " + ", ".join(f"{k} {ms:.1f} ms" for k, ms in self.table[w].items()) + f" -> {self.choice[w]}"
                for w in sorted(self.table)]
        return f"GEMM choice ({self.threads} thread(s)): " + "; ".join(rows)


def time_gemms(weights: Sequence[tuple[torch.Tensor, torch.Tensor | None]], packed: Sequence[torch.Tensor | None],
               kernel: str, rows: int, inputs: dict) -> float:
    """ms to run every linear layer once with ``rows`` input rows through ``kernel``."""
    t0 = time.perf_counter()
    for (w, b), p in zip(weights, packed):
        x = inputs[(rows, w.shape[1])]
        run_kernel(kernel, x, w, p, b)
    return (time.perf_counter() - t0) * 1e3


CLEAR_MARGIN = 1.3      # choose_gemm stops early once the best kernel is this much faster at every width


def _clear(samples, width, candidates) -> bool:
    best = sorted(min(samples[(width, k)]) for k in candidates)
    return best[1] >= CLEAR_MARGIN * best[0]


def choose_gemm(model: nn.Module, widths: Iterable[int] = range(1, 9), threads: int | None = None,
                repeats: int = 5, candidates: Sequence[str] | None = None, uniform: bool = True) -> GemmChoice:
    """Times each candidate kernel (default: MKL, and oneDNN when available) over all the model's linear
    layers at each width, interleaved (repeat -> width -> kernel, the kernel order rotating), and picks
    the fastest by min over repeats, oneDNN unless MKL is more than 3% faster (``PREFER_MARGIN``).
    ``uniform`` (the default): one kernel for every width, the one with the least total time over the
    widths -- a row's result then cannot depend on the block width, and a burst of load on the machine
    during the measurement cannot leave a few widths on a kernel that is slow there (seen once: a
    concurrent process made MKL win widths 3 and 5-7 on 2 cores, and width 5 then cost 53 ms instead
    of 19 for the whole run). ``uniform=False``: the fastest per width. Stops after 2 repeats when
    every width is decided by 30% or more. ``threads``: torch threads during the measurement (restored
    after; None = current)."""
    widths = sorted({int(w) for w in widths})
    if not widths or widths[0] < 1:
        raise ValueError("widths must be positive integers")
    notes = []
    if candidates is None:
        candidates = [MKL] + ([ONEDNN] if onednn_available() else [])
        if ONEDNN not in candidates:
            notes.append("oneDNN unavailable: MKL only")
    candidates = list(candidates)
    if ONEDNN in candidates and not onednn_available():
        candidates.remove(ONEDNN)
        notes.append("oneDNN unavailable: MKL only")
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        weights = linear_weights(model)
        if not weights:
            raise ValueError("the model has no linear layers")
        if ONEDNN in candidates:   # reuse the packed copies of FastLinears already installed
            packed = [m.packed if isinstance(m, FastLinear) and m.packed is not None else pack_weight(m.weight)
                      for m in model.modules() if isinstance(m, (nn.Linear, FastLinear))]
        else:
            packed = [None] * len(weights)
        gen = torch.Generator().manual_seed(0)
        inputs = {(r, k): torch.randn(r, k, generator=gen) for r in widths for k in {w.shape[1] for w, _ in weights}}
        samples = {(w, k): [] for w in widths for k in candidates}
        with torch.inference_mode():
            for w in widths:                                        # warm every kernel and shape once
                for k in candidates:
                    time_gemms(weights, packed, k, w, inputs)
            for rep in range(repeats):
                for w in widths:
                    order = candidates[rep % len(candidates):] + candidates[:rep % len(candidates)]
                    for k in order:
                        samples[(w, k)].append(time_gemms(weights, packed, k, w, inputs))
                if rep >= 1 and len(candidates) > 1 and all(_clear(samples, w, candidates) for w in widths):
                    break                                           # every width decided by a wide margin
        table = {w: {k: min(samples[(w, k)]) for k in candidates} for w in widths}

        def pick(t: Mapping[str, float]) -> str:
            if ONEDNN in t and MKL in t:
                return ONEDNN if t[ONEDNN] <= t[MKL] / PREFER_MARGIN else MKL
            return min(t, key=t.get)

        if uniform:
            kernel = pick({k: sum(table[w][k] for w in widths) for k in candidates})
            choice = {w: kernel for w in widths}
        else:
            choice = {w: pick(table[w]) for w in widths}
        # Beyond the widths measured (prefill): oneDNN when it won the widest one measured.
        default = choice[widths[-1]]
        return GemmChoice(choice, table, torch.get_num_threads(), default, notes)
    finally:
        torch.set_num_threads(before)



def configure(model: nn.Module, gemm: str, widths: Iterable[int]) -> tuple[str, str, GemmChoice | None]:
    """Installs the GEMM path ``gemm`` ("auto", "onednn" or "mkl") on every CPU fp32 linear layer of
    ``model``; returns (the kernel in use: "onednn", "mkl", or "auto" for a per-width mix; why; the
    measurement, or None). "auto" measures with ``choose_gemm`` and installs its choice; MKL at every width
    means plain ``nn.Linear`` modules (no packed copies)."""
    if gemm not in GEMM_MODES:
        raise ValueError(f"gemm must be one of {GEMM_MODES}, not {gemm!r}")
    if gemm == MKL:
        uninstall(model)
        return MKL, "asked for", None
    if not onednn_available():
        log.warning("oneDNN linears unavailable in this torch build: using MKL (F.linear)")
        uninstall(model)
        return MKL, "oneDNN unavailable", None
    install(model, {}, ONEDNN)
    if gemm == ONEDNN:
        return ONEDNN, "asked for", None
    choice = choose_gemm(model, widths)
    install(model, choice.choice, choice.default)
    log.info("%s", choice.describe())
    if all(k == MKL for k in list(choice.choice.values()) + [choice.default]):
        uninstall(model)
        return MKL, "measured: MKL faster", choice
    return ("auto" if not choice.uniform else choice.default), "measured", choice
