"""The modes a benchmark compares, and the order in which they are given up when time is short.

* ``baseline``: plain decoding through the verifier (``no_speculation``), the denominator of every
  Tandem speedup.
* ``k=N``: speculative decoding through the gateway with a fixed draft length N.
* ``adaptive``: an adaptive draft length: up to ``--adaptive-k`` tokens a round, the drafter ending a
  block early before a token it is less sure of than ``--draft-confidence`` (GenerateRequest field
  ``draft_confidence``; a gateway without that field skips the mode, with a note). Fixed-k modes send
  ``draft_confidence = 0`` so that they draft exactly k tokens whatever the gateway's default.
* ``hf_plain`` / ``hf_assisted``: in-process Hugging Face transformers ``generate`` of the same
  target, alone and with ``assistant_model=`` the torch version of the drafter: the peer baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

BASELINE = "baseline"
ADAPTIVE = "adaptive"
HF_PLAIN = "hf_plain"
HF_ASSISTED = "hf_assisted"
ADAPTIVE_FIELDS = ("draft_confidence",)


@dataclass(frozen=True)
class Mode:
    name: str
    kind: str          # "gateway" or "hf"
    k: int = 0         # fixed draft length (gateway speculative modes); adaptive: the most per round
    speculative: bool = False
    adaptive: bool = False
    confidence: float = 0.0  # adaptive: the drafter's confidence stop

    @property
    def label(self) -> str:
        return {BASELINE: "baseline (no speculation)", HF_PLAIN: "HF generate (target alone)",
                HF_ASSISTED: "HF assisted generation",
                ADAPTIVE: f"adaptive k<={self.k} (stop below p {self.confidence:g})"}.get(self.name,
                                                                                       f"speculative {self.name}")


def spec_mode(k: int) -> Mode:
    return Mode(f"k={k}", "gateway", k=k, speculative=True)


BASELINE_MODE = Mode(BASELINE, "gateway")


def adaptive_mode(max_k: int, confidence: float) -> Mode:
    return Mode(ADAPTIVE, "gateway", k=max_k, speculative=True, adaptive=True, confidence=confidence)

HF_PLAIN_MODE = Mode(HF_PLAIN, "hf")
HF_ASSISTED_MODE = Mode(HF_ASSISTED, "hf", speculative=True)


def adaptive_field(request_cls) -> str | None:
    """The GenerateRequest field that turns on the gateway's adaptive draft length, if it has one."""
    names = {f.name for f in request_cls.DESCRIPTOR.fields}
    return next((n for n in ADAPTIVE_FIELDS if n in names), None)


def coverage_order(ks: list[int], first: int) -> list[int]:
    """``first`` (if in ks), then repeatedly the k farthest from those already chosen: when time is
    short the kept part of the sweep still spans it (4, 8, 1, 6, 2, 3 for 1..8 from 4)."""
    rest = sorted(set(ks))
    order = [first] if first in rest else [rest.pop(len(rest) // 2)]
    rest = [k for k in rest if k != order[0]]
    while rest:
        best = max(rest, key=lambda k: (min(abs(k - c) for c in order), -k))
        order.append(best)
        rest.remove(best)
    return order


def priority(modes: list[Mode], default_k: int) -> list[Mode]:
    """The order modes are kept in when the time budget is short: baseline, the default k, adaptive,
    the HF pair (assisted needs plain to compare with), then the rest of the sweep in coverage order."""
    by_name = {m.name: m for m in modes}
    ks = coverage_order([m.k for m in modes if m.kind == "gateway" and m.speculative and not m.adaptive], default_k)
    order = [BASELINE, f"k={ks[0]}" if ks else None, ADAPTIVE, HF_PLAIN, HF_ASSISTED, *[f"k={k}" for k in ks[1:]]]
    return [by_name[n] for n in order if n in by_name]
