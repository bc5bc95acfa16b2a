"""One round's figures, written down once. The gateway's round loop fills a ``Round``; the wire message
(``RoundStats``, via ``tandem.pb_convert``), the round span's attributes (``gateway.tracing``) and the
``--trace`` table (``round_table``) are all derived from the fields declared here, so a figure added
to ``Round`` appears everywhere (the proto must declare a field of the same name: a test checks it).

Terms (docs/DESIGN.md): a round drafts a block of ``proposed`` tokens (``k`` asked for), the verifier keeps
``accepted`` of them and emits one more token of its own: the recovered token at the first rejected
position, or the bonus token when the whole block was accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


def figure(default, header: str, width: int, fmt: str = "", *, table: bool = True):
    """A dataclass field that is one of a round's figures: its default, table column header, width and format."""
    return field(default=default, metadata={"header": header, "width": width, "fmt": fmt, "table": table})


@dataclass(frozen=True)
class Round:
    """One round's outcome: the tokens it emitted and the figures docs/DESIGN.md asks for."""

    index: int = figure(0, "round", 5)                   # 0 is the prefill (first token), rounds count from 1
    k: int = figure(0, "k", 3)                           # draft length asked for (0: plain decoding)
    proposed: int = figure(0, "proposed", 8)
    accepted: int = figure(0, "accepted", 8)
    rejection_position: int = figure(-1, "reject@", 7)    # index in the block of the first rejected draft, -1 if none
    bonus: bool = figure(False, "bonus", 5)
    emitted: int = figure(0, "emitted", 7)               # accepted drafts + recovered/bonus, after the EOS/max cut
    lookup_tokens: int = figure(0, "lookup", 6)          # drafts copied from the context by prompt lookup
    draft_ms: float = figure(0.0, "draft ms", 9, ".1f")    # drafter's own compute
    verify_ms: float = figure(0.0, "verify ms", 9, ".1f")  # verifier's own compute (target forward + acceptance)
    overhead_ms: float = figure(0.0, "network ms", 10, ".1f")  # round wall time minus both servers' compute
    wire_ms: float = figure(0.0, "wire ms", 7, ".2f")      # the Verify call's wall time minus the verifier's compute
    gateway_ms: float = figure(0.0, "gw ms", 6, ".2f")     # the gateway's own work in the round (choice, proposal)
    stream_ms: float = figure(0.0, "stream ms", 9, ".2f")  # from the previous round's end: detokenize and send
    round_ms: float = figure(0.0, "round ms", 9, ".1f")    # wall time of the round as seen by the gateway
    k_reason: str = figure("", "why k", 10)            # the draft-length choice: best, probe, pinned, ...
    source: str = figure("", "block", 7)               # where the block came from: copy, ahead, wait, propose
    expected_tokens: float = figure(0.0, "E[tok]", 6, ".2f")          # what the choice expected to emit
    expected_tokens_per_ms: float = figure(0.0, "E[tok/s]", 8, ".1f")  # ... per ms (the table shows per s)
    fallback_reason: str = figure("", "", 0, table=False)  # set on the round where speculation was abandoned
    tokens: tuple[int, ...] = field(default=(), metadata={})   # the emitted ids (not a figure)
    origins: tuple[str, ...] = field(default=(), metadata={})  # per emitted token: draft, lookup or target

    @classmethod
    def measured(cls, *, round_ms: float, draft_ms: float, verify_ms: float, **figures) -> "Round":
        """A round whose overhead is what the servers did not account for: network, serialization, queuing."""
        return cls(round_ms=round_ms, draft_ms=draft_ms, verify_ms=verify_ms,
                   overhead_ms=max(0.0, round_ms - draft_ms - verify_ms), **figures)


FIGURES: tuple[str, ...] = tuple(f.name for f in fields(Round) if f.metadata)


def figures(rnd: Round) -> dict:
    """The round's figures by name (what the wire message and the span carry)."""
    return {name: getattr(rnd, name) for name in FIGURES}


def _cell(rnd: Round, name: str, fmt: str) -> str:
    value = getattr(rnd, name)
    if name == "rejection_position" and value < 0:
        return "-"
    if name == "bonus":
        return "yes" if value else ""
    if name == "lookup_tokens" and not value:
        return ""
    if name == "expected_tokens_per_ms":
        return format(value * 1e3, fmt) if value else ""
    if name == "expected_tokens" and not value:
        return ""
    return format(value, fmt)


def round_table(rounds, prefill_ms: float = 0.0) -> str:
    """The round-by-round timeline: where each round's time went; ``rounds`` are Round records."""
    columns = [f for f in fields(Round) if f.metadata.get("table")]
    line = (lambda cells: " ".join(f"{c:>{f.metadata['width']}}" for f, c in zip(columns, cells)))
    out = [line([f.metadata["header"] for f in columns]),
           line(["0" if f.name == "index" else "prefill" if f.name == "accepted" else
                 format(prefill_ms, ".1f") if f.name in ("verify_ms", "round_ms") else "" for f in columns])]
    rounds = list(rounds)
    for rnd in rounds:
        out.append(line([_cell(rnd, f.name, f.metadata["fmt"]) for f in columns]))
    totals = {name: sum(getattr(r, name) for r in rounds) for name in
              ("proposed", "accepted", "emitted", "lookup_tokens", "draft_ms", "verify_ms", "overhead_ms",
               "wire_ms", "gateway_ms", "stream_ms", "round_ms")}
    totals["verify_ms"] += prefill_ms           # the prefill row counts in both columns' totals
    totals["round_ms"] += prefill_ms
    out.append(line(["total" if f.name == "index" else
                     format(totals[f.name], f.metadata["fmt"]) if f.name in totals else "" for f in columns]))
    return "\n".join(out)
