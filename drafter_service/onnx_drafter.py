"""``OnnxDrafter``: the ONNX model drafter with optional prompt lookup, built in one call.

It is the composition of the drafter kinds (drafter_service.drafter): ``ModelDrafter`` (the ONNX
decoder with a KV cache per session, drafter_service.model_drafter) wrapped by ``LookupDrafter``
(prompt lookup, drafter_service.lookup_drafter; off when ``lookup_max_ngram`` is 0). Kept for code
that builds the drafter by hand (tests, the bench, distill's evaluation); the service builds drafters
with drafter_service.factory.load_drafter, which also serves other kinds. No torch here.
"""

from __future__ import annotations

import os

from drafter_service.drafter import DEFAULT_MAX_SESSIONS
from drafter_service.lookup_drafter import LookupDrafter
from drafter_service.model_drafter import (  # noqa: F401 - re-exported for existing imports
    DEFAULT_PREFILL_CHUNK, DRAFTER_FORMAT, METADATA_FILE, MODEL_FILE, DrafterMetadata, ModelDrafter,
    default_providers)
from tandem.errors import UnknownSession  # noqa: F401 - what propose raises for a session it cannot continue


class OnnxDrafter(LookupDrafter):
    """Proposes draft blocks with an ONNX decoder, prompt lookup first when ``lookup_max_ngram`` > 0;
    thread-safe (one proposal per session at a time). The model's attributes (``meta``, ``providers``,
    ``onnx_path``, ``session``, ``support_size``, ``prefill_chunk``) are read through to it."""

    def __init__(self, model_path, *, threads: int | None = None, providers: list[str] | None = None,
                 support_size: int = 64, session_ttl_s: float = 600.0,
                 max_sessions: int | None = DEFAULT_MAX_SESSIONS, lookup_max_ngram: int = 0,
                 lookup_min_ngram: int = 2, lookup_trust_ngram: int = 1, lookup_check_confidence: float = 0.5,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK):
        """``lookup_max_ngram`` > 0 turns on prompt lookup (drafter_service.lookup): draft tokens copied
        from the context when its last n-gram (n = max .. min) recurs, the model drafting the rest.
        Tokens found by an n-gram shorter than ``lookup_trust_ngram`` are checked against the model: kept
        while its top token agrees or its top probability is below ``lookup_check_confidence``.
        ``prefill_chunk``: the most tokens fed in one ONNX run (long prompts are fed in chunks)."""
        model = ModelDrafter(model_path, threads=threads, providers=providers, support_size=support_size,
                             session_ttl_s=session_ttl_s, max_sessions=max_sessions, prefill_chunk=prefill_chunk)
        super().__init__(model, max_ngram=lookup_max_ngram, min_ngram=lookup_min_ngram,
                         trust_ngram=lookup_trust_ngram, check_confidence=lookup_check_confidence)

    # today's attribute names of the lookup settings
    lookup_max_ngram = property(lambda self: self.max_ngram)
    lookup_min_ngram = property(lambda self: self.min_ngram)
    lookup_trust_ngram = property(lambda self: self.trust_ngram)
    lookup_check_confidence = property(lambda self: self.check_confidence)

    def __getattr__(self, name: str):
        if name == "inner" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def load(model_path: str | os.PathLike, **kwargs) -> OnnxDrafter:
    """Shorthand for ``OnnxDrafter(model_path, **kwargs)``."""
    return OnnxDrafter(model_path, **kwargs)
