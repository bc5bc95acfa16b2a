"""Loading phases a service announces on stderr, one line each as it enters them: ``[tandem] phase: NAME``.
`tandem up` shows the last one of each service still loading, and `tandem generate` says it when asked to
call a gateway that is not up yet."""

from __future__ import annotations

import sys


def enter(name: str) -> None:
    """Says that the service now enters the loading phase ``name`` (e.g. 'reading the file')."""
    print(f"[tandem] phase: {name}", file=sys.stderr, flush=True)
