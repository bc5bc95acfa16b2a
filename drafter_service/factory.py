"""Building a drafter from its directory: ``drafter.json``'s ``kind`` picks the implementation.

    load_drafter("drafters/smollm2-135m-instruct", threads=1, lookup_max_ngram=4)

Kinds (``drafter.json`` ``"kind"``; a file without one, or a bare .onnx without drafter.json, is
``"model"``):

* ``"model"``: an ONNX decoder-with-past (drafter_service.model_drafter.ModelDrafter).
* ``"gguf"``: a .gguf file, run by the verifier's decoder with int8 activations
  (drafter_service.gguf_drafter.GgufDrafter): the target's own file drafts for it.

Model-free kinds need no files: ``load_drafter("suffix")`` builds the suffix drafter with no model
(drafter_service.suffix_drafter.SuffixDrafter), which serves any target; ``suffix_scope`` and
``suffix_memory_tokens`` configure it (prompt lookup's options do not apply: its per-session view
over the prompt and output does that job, with frequencies).

Prompt lookup and suffix drafting are serving options of a model kind, not kinds of artifact:
``lookup_max_ngram`` > 0 wraps whatever the kind built in drafter_service.lookup_drafter.LookupDrafter,
and ``suffix`` puts suffix drafting in front of that. A new kind (e.g. a drafter fed the target's
hidden states) registers a loader with ``register_kind`` and derives from
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
MODEL_FREE_KINDS = ("suffix",)      # built without files: the name given as the drafter

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


def _load_gguf(path, **options) -> Drafter:
    from drafter_service.gguf_drafter import GgufDrafter

    return GgufDrafter(path, **options)


register_kind("gguf", _load_gguf)


def drafter_kind(path: str | os.PathLike) -> str:
    """The ``kind`` in the drafter.json of a drafter directory (or beside a model file); "model" without one;
    "gguf" for a .gguf file (the target's own file as the drafter: drafter_service.gguf_drafter)."""
    p = Path(path).expanduser()
    if p.suffix.lower() == ".gguf":
        return "gguf"
    meta = (p if p.is_dir() else p.parent) / METADATA_FILE
    if not meta.exists():
        return DEFAULT_KIND
    try:
        raw = json.loads(meta.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{meta} is not valid JSON: {exc}") from exc
    return str(raw.get("kind") or DEFAULT_KIND)


def load_drafter(path: str | os.PathLike, *, lookup_max_ngram: int = 0, lookup_min_ngram: int = 2,
                 lookup_trust_ngram: int = 1, lookup_check_confidence: float = 0.5, suffix: bool = False,
                 suffix_scope: str = "global", suffix_memory_tokens: int | None = None,
                 suffix_seed: str | None = "auto", suffix_store: str | os.PathLike | None = None, **options) -> Drafter:
    """The drafter at ``path`` (a directory with drafter.json, or a model file), built by its kind's loader
    with ``options`` (for "model": threads, providers, support_size, session_ttl_s, max_sessions,
    prefill_chunk); wrapped with prompt lookup when ``lookup_max_ngram`` > 0, and with suffix drafting in
    front when ``suffix`` is set and ``suffix_scope`` is not "off". ``path`` "suffix": the model-free
    suffix drafter (``session_ttl_s`` and ``max_sessions`` apply; model and lookup options are ignored).
    Global suffix drafting starts with what ``suffix_index_files`` names read in (seeds, then the store)."""
    from drafter_service.suffix import DEFAULT_MEMORY_TOKENS
    from drafter_service.suffix_drafter import SuffixDrafter, check_scope

    check_scope(suffix_scope)
    memory = DEFAULT_MEMORY_TOKENS if suffix_memory_tokens is None else int(suffix_memory_tokens)
    if str(path) in MODEL_FREE_KINDS:
        sessions = {k: options[k] for k in ("session_ttl_s", "max_sessions") if k in options}
        return _seeded(SuffixDrafter(None, scope=suffix_scope, memory_tokens=memory, **sessions),
                       suffix_index_files(path, suffix_seed, suffix_store, suffix_scope))
    kind = drafter_kind(path)
    loader = _KINDS.get(kind)
    if loader is None:
        known = ", ".join(kinds() + list(MODEL_FREE_KINDS))
        raise ValueError(f"{path}: unknown drafter kind {kind!r} (known: {known})")
    drafter = loader(path, **options)
    wrappers = (lookup_max_ngram and lookup_max_ngram > 0) or (suffix and suffix_scope != "off")
    if wrappers and not isinstance(drafter, ContextDrafter):
        raise ValueError(f"prompt lookup and suffix drafting need a drafter that keeps each session's context; "
                         f"kind {kind!r} does not: serve it with both off (--lookup-ngram 0, --suffix off)")
    if lookup_max_ngram and lookup_max_ngram > 0:
        from drafter_service.lookup_drafter import LookupDrafter

        drafter = LookupDrafter(drafter, max_ngram=lookup_max_ngram, min_ngram=lookup_min_ngram,
                                trust_ngram=lookup_trust_ngram, check_confidence=lookup_check_confidence)
    if suffix and suffix_scope != "off":
        drafter = _seeded(SuffixDrafter(drafter, scope=suffix_scope, memory_tokens=memory),
                          suffix_index_files(path, suffix_seed, suffix_store, suffix_scope))
    return drafter


SEED_FILE = "suffix_seed.jsonl.gz"      # a drafter directory's seed: text its target wrote (suffix_store)


def suffix_index_files(path, seed: str | None, store, scope: str) -> list[Path]:
    """The files global suffix drafting starts from: the store (``store``) when it exists — it holds what the
    index kept last time, the seeds' text included, so the seeds are not read again (their text would count
    twice) — else the seeds (``seed``: "auto" = the drafter directory's SEED_FILE when it has one,
    "none"/None/"" = none, else comma-separated paths)."""
    explicit = seed not in (None, "", "auto", "none")
    if scope != "global":
        if explicit or store:
            raise ValueError("--suffix-seed and --suffix-store fill the global suffix index: they need "
                             f"--suffix-scope global (got {scope!r})")
        return []
    if store and Path(store).exists():
        return [Path(store)]
    if seed == "auto":
        return [Path(path) / SEED_FILE] if Path(path).is_dir() and (Path(path) / SEED_FILE).is_file() else []
    return seed_paths(seed) if explicit else []


def seed_paths(seed: str) -> list[Path]:
    """The comma-separated paths a seed flag names (--suffix-seed, --drafter-guess-seed), empty ones skipped."""
    return [Path(p.strip()) for p in str(seed).split(",") if p.strip()]


def _seeded(drafter, files: list[Path]):
    from drafter_service import suffix_store

    for f in files:
        suffix_store.load(drafter.index, f)
    return drafter
