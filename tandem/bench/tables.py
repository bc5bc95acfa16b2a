"""Markdown cells and tables for the bench reports: numbers, ratios, percentages, mode labels.

A missing figure (None) prints as ``n/a`` in number cells and ``–`` in ratio and percentage cells;
a speedup or ratio below 1 is printed bold with ``↓`` (speculation loses there).
"""

from __future__ import annotations

from tandem.bench import modes as M


def fmt(x, spec="{:.2f}", none="n/a") -> str:
    """A number formatted by ``spec`` (``none`` for a missing one)."""
    return none if x is None else spec.format(x)


def speedup_cell(fig: dict, key: str = "speedup", spread: bool = True) -> str:
    """A mode's speedup (``key`` of its figures), with its per-repeat [min–max] when ``spread``."""
    v = fig.get(key)
    if v is None:
        return "–"
    s = f"{v:.2f}x"
    if spread and fig.get("speedup_min") is not None and key == "speedup":
        s += f" [{fig['speedup_min']:.2f}–{fig['speedup_max']:.2f}]"
    return f"**{s}** ↓" if v < 1.0 else s


def ratio_cell(x) -> str:
    if x is None:
        return "–"
    return f"**{x:.2f}x** ↓" if x < 1.0 else f"{x:.2f}x"


def pct(x) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def text_cell(text: str) -> str:
    """A model output in one cell: pipes escaped, on one line, at most 120 characters."""
    return text.replace("|", "\\|").replace("\n", " ")[:120]


def mode_label(m: str) -> str:
    return {M.BASELINE: "baseline", M.HF_PLAIN: "HF plain", M.HF_ASSISTED: "HF assisted", M.AUTO: "auto",
            M.LLAMA_PLAIN: "llama.cpp plain", M.LLAMA_LOOKUP: "llama.cpp lookup"}.get(m, m)


def int_keys(d: dict | None) -> dict[int, float]:
    """JSON turns int keys into strings: back to ints, sorted."""
    return {int(k): v for k, v in sorted((d or {}).items(), key=lambda kv: int(kv[0]))}


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a Markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out
