"""A live service's Prometheus text endpoint as the bench reads it: its samples, in order."""

from __future__ import annotations

import urllib.request


def samples(url: str, timeout_s: float = 5.0) -> list[tuple[str, float]]:
    """Each sample of the endpoint at ``url``, in order: (its name with its labels, its value). Comments and
    lines that are not a sample are skipped. Raises what urllib raises when the endpoint cannot be read."""
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        text = resp.read().decode("utf-8", "replace")
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.rsplit(None, 1)
        if len(parts) != 2:
            continue
        try:
            out.append((parts[0], float(parts[1])))
        except ValueError:
            continue
    return out
