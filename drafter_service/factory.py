"""Building a drafter from its directory: ``drafter.json``'s ``kind`` picks the implementation.

    load_drafter("drafters/smollm2-135m-instruct", threads=1, lookup_max_ngram=4)

Kinds (``drafter.json`` ``"kind"``; a file without one, or a bare .onnx without drafter.json, is
``"model"``):

* ``"model"``: an ONNX decoder-with-past (drafter_service.model_drafter.ModelDrafter).

Prompt lookup is a serving option, not a kind of artifact: ``lookup_max_ngram`` > 0 wraps whatever
the kind built in drafter_service.lookup_drafter.LookupDrafter. A new kind (e.g. a drafter fed the
target's hidden states) registers a loader with ``register_kind`` and derives from
drafter_service.drafter.ContextDrafter; the servicer needs nothing else.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from drafter_service.drafter import ContextDrafter, Drafter

METADATA_FILE = "drafter.json"
DEFAULT_KIND = "model"

_KINDS: dict[str, Callable[..., Drafter]] = {}


def register_kind(kind: str, loader: Callable[..., Drafter]) -> None:
    """``loader(path, **options) -> Drafter`` builds drafters whose drafter.json says ``"kind": kind``."""
    _KINDS[kind] = loader


def kinds() -> list[str]:
    return sorted(_KINDS)


def _load_model(path, **options) -> Drafter:
    from drafter_service.model_drafter import ModelDrafter

    return ModelDrafter(path, **options)


register_kind("model", _load_model)


def drafter_kind(path: str | os.PathLike) -> str:
    """The ``kind`` in the drafter.json of a drafter directory (or beside a model file); "model" without one."""
    p = Path(path).expanduser()
    meta = (p if p.is_dir() else p.parent) / METADATA_FILE
    if not meta.exists():
        return DEFAULT_KIND
    try:
        raw = json.loads(meta.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{meta} is not valid JSON: {exc}") from exc
    return str(raw.get("kind") or DEFAULT_KIND)


def load_drafter(path: str | os.PathLike, *, lookup_max_ngram: int = 0, lookup_min_ngram: int = 2,
                 lookup_trust_ngram: int = 1, lookup_check_confidence: float = 0.5, **options) -> Drafter:
    """The drafter at ``path`` (a directory with drafter.json, or a model file), built by its kind's loader
    with ``options`` (for "model": threads, providers, support_size, session_ttl_s, max_sessions,
    prefill_chunk); wrapped with prompt lookup when ``lookup_max_ngram`` > 0."""
    kind = drafter_kind(path)
    loader = _KINDS.get(kind)
    if loader is None:
        raise ValueError(f"{path}: unknown drafter kind {kind!r} (known: {', '.join(kinds())})")
    drafter = loader(path, **options)
    if lookup_max_ngram and lookup_max_ngram > 0:
        if not isinstance(drafter, ContextDrafter):
            raise ValueError(f"prompt lookup needs a drafter that keeps each session's context; kind {kind!r} "
                             "does not: serve it with lookup off (lookup_max_ngram 0)")
        from drafter_service.lookup_drafter import LookupDrafter

        drafter = LookupDrafter(drafter, max_ngram=lookup_max_ngram, min_ngram=lookup_min_ngram,
                                trust_ngram=lookup_trust_ngram, check_confidence=lookup_check_confidence)
    return drafter
