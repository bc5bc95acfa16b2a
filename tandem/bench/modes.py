"""The modes a benchmark compares, and the order in which they are given up when time is short.

* ``baseline``: plain decoding through the verifier (``no_speculation``), the denominator of every
  Tandem speedup.
* ``auto``: speculative decoding with the gateway's automatic draft length (``draft_length = 0``:
  each round's k, 0 = a plain step, maximises expected tokens per ms from measured costs;
  ``gateway/draft_length/``). The bench's default speculative mode: first after the baseline.
* ``k=N``: speculative decoding through the gateway with a fixed (pinned) draft length N: the sweep
  auto is compared with.
* ``adaptive``: an adaptive draft length: up to ``--adaptive-k`` tokens a round, the drafter ending a
  block early before a token it is less sure of than ``--draft-confidence`` (GenerateRequest field
  ``draft_confidence``; a gateway without that field skips the mode, with a note). Fixed-k modes send
  ``draft_confidence = 0`` so that they draft exactly k tokens whatever the gateway's default.
* ``hf_plain`` / ``hf_assisted``: in-process Hugging Face transformers ``generate`` of the same
  target, alone and with ``assistant_model=`` the torch version of the drafter: the peer baseline.
* ``llama_plain`` / ``llama_lookup``: in-process llama.cpp (``llama-cpp-python``) on the target's
  GGUF file, alone and with prompt lookup decoding (``LlamaPromptLookupDecoding``), the same thread
  count as the verifier. llama.cpp quantises activations, so its outputs are compared, not required
  to match (``tandem.bench.llama_peer``).
"""

from __future__ import annotations

from dataclasses import dataclass

BASELINE = "baseline"
AUTO = "auto"
ADAPTIVE = "adaptive"
HF_PLAIN = "hf_plain"
HF_ASSISTED = "hf_assisted"
LLAMA_PLAIN = "llama_plain"
LLAMA_LOOKUP = "llama_lookup"
PEERS = (HF_PLAIN, HF_ASSISTED, LLAMA_PLAIN, LLAMA_LOOKUP)   # not Tandem: outside its equivalence check
ADAPTIVE_FIELDS = ("draft_confidence",)


@dataclass(frozen=True)
class Mode:
    name: str
    kind: str          # "gateway", "hf" or "llama"
    k: int = 0         # fixed draft length (gateway speculative modes); adaptive: the most per round; auto: 0
    speculative: bool = False
    adaptive: bool = False
    confidence: float = 0.0  # adaptive: the drafter's confidence stop
    auto: bool = False       # the gateway chooses k every round (draft_length = 0)

    @property
    def label(self) -> str:
        return {BASELINE: "baseline (no speculation)", HF_PLAIN: "HF generate (target alone)",
                HF_ASSISTED: "HF assisted generation", AUTO: "auto draft length (the gateway's choice per round)",
                LLAMA_PLAIN: "llama.cpp (target GGUF alone)", LLAMA_LOOKUP: "llama.cpp prompt lookup decoding",
                ADAPTIVE: f"adaptive k<={self.k} (stop below p {self.confidence:g})"}.get(self.name,
                                                                                       f"speculative {self.name}")


def spec_mode(k: int) -> Mode:
    return Mode(f"k={k}", "gateway", k=k, speculative=True)


BASELINE_MODE = Mode(BASELINE, "gateway")
AUTO_MODE = Mode(AUTO, "gateway", k=0, speculative=True, auto=True)


def adaptive_mode(max_k: int, confidence: float) -> Mode:
    return Mode(ADAPTIVE, "gateway", k=max_k, speculative=True, adaptive=True, confidence=confidence)

HF_PLAIN_MODE = Mode(HF_PLAIN, "hf")
HF_ASSISTED_MODE = Mode(HF_ASSISTED, "hf", speculative=True)
LLAMA_PLAIN_MODE = Mode(LLAMA_PLAIN, "llama")
LLAMA_LOOKUP_MODE = Mode(LLAMA_LOOKUP, "llama", speculative=True)


def is_fixed_k(mode: Mode | dict) -> bool:
    """A speculative gateway mode with a pinned k (the sweep): not auto, not adaptive."""
    get = mode.get if isinstance(mode, dict) else lambda a, d=None: getattr(mode, a, d)
    return get("kind") == "gateway" and bool(get("speculative")) and not get("adaptive") and not get("auto", False)


def fixed_k_of(name: str) -> int | None:
    """``"k=3"`` -> 3; anything else -> None."""
    if name.startswith("k=") and name[2:].isdigit():
        return int(name[2:])
    return None


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
    """The order modes are kept in when the time budget is short: baseline, auto, the sweep's first k
    (``--default-k``), the llama.cpp pair (cheap), the rest of the sweep in coverage order (auto is
    compared with the best of it), the HF pair (assisted needs plain to compare with), adaptive."""
    by_name = {m.name: m for m in modes}
    ks = coverage_order([m.k for m in modes if is_fixed_k(m)], default_k)
    order = [BASELINE, AUTO, f"k={ks[0]}" if ks else None, LLAMA_PLAIN, LLAMA_LOOKUP, *[f"k={k}" for k in ks[1:]],
             HF_PLAIN, HF_ASSISTED, ADAPTIVE]
    return [by_name[n] for n in order if n in by_name]


def essential(prioritised: list[Mode]) -> int:
    """How many of the first modes in priority order always run: the baseline, auto (when there) and the
    first fixed k (auto's comparison)."""
    names = [m.name for m in prioritised[:3]]
    return 3 if AUTO in names and len(names) == 3 and fixed_k_of(names[2]) is not None else 2
