"""Pinning a service to CPUs (Linux): ``--cpus 1`` or ``--cpus 0-3,6``.

A service pins itself before its thread pools (torch, ONNX Runtime, gRPC) start, so every thread it
makes later inherits the set. ``tandem up`` / ``tandem bench`` use it to keep the drafter off the
verifier's cores (``--drafter-cpus`` / ``--verifier-cpus``): on one machine that is the nearest thing
to the two-machine deployment, where drafting never competes with verification for compute.
"""

from __future__ import annotations

import os


def parse_cpus(spec: str) -> set[int]:
    """'0-2,5' -> {0, 1, 2, 5}. Raises ValueError on anything else."""
    cpus: set[int] = set()
    for part in str(spec).replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad CPU list {spec!r}: expected numbers and ranges such as '1' or '0-3,6'")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"bad CPU range {part!r} in {spec!r}: the end is below the start")
        cpus.update(range(first, last + 1))
    if not cpus:
        raise ValueError(f"bad CPU list {spec!r}: no CPU named")
    return cpus


def cores_shared(verifier_cpus: str | None, drafter_cpus: str | None) -> bool:
    """Whether a drafter and a verifier started on this machine with these CPU lists may run on the same
    cores: yes unless both are pinned, to disjoint sets."""
    if not verifier_cpus or not drafter_cpus:
        return True
    return bool(parse_cpus(verifier_cpus) & parse_cpus(drafter_cpus))


def check_cpus(spec: str) -> set[int]:
    """The CPUs of ``spec``, if this platform can pin and this process may use them all; else raises
    RuntimeError (no pinning here) or ValueError (a bad list, or CPUs this process may not use)."""
    if not hasattr(os, "sched_setaffinity"):
        raise RuntimeError("pinning to CPUs needs Linux (os.sched_setaffinity); leave the CPU flags unset here")
    cpus = parse_cpus(spec)
    allowed = os.sched_getaffinity(0)
    if not cpus <= allowed:
        raise ValueError(f"CPUs {format_cpus(cpus - allowed)} are not available to this process "
                         f"(it may use {format_cpus(allowed)})")
    return cpus


def pin_to_cpus(spec: str) -> set[int]:
    """Restricts this process (and the threads it starts from now on) to the CPUs of ``spec``."""
    cpus = check_cpus(spec)
    os.sched_setaffinity(0, cpus)
    return cpus


def format_cpus(cpus) -> str:
    """{0, 1, 2, 5} -> '0-2,5'."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
