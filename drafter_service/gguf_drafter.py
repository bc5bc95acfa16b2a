"""The ``gguf`` drafter kind: the target's own GGUF file, run with llama.cpp's int8 arithmetic, as the drafter.

A home user already has the drafter this kind needs: the model file the target box serves. The drafter box
runs the same file through the verifier's C kernels with int8 activations (``--activations int8``: each row
of activations rounded to 8 bits a 32-value block, integer dot products), which on a 2-core Zen 4 takes a
one-token step in about half the time of the target's default fp32 arithmetic, and whose greedy token is the
target's own at about 98 % of positions (BENCHMARKS.md, twenty-ninth session). So its blocks are long and
almost always kept, where a distilled student of a 135 M target kept about one first token in four; and
drafted ahead on its own box (``drafter_service.ahead``) it is off the target's critical path.

Exactness does not rest on the two arithmetics agreeing: like any drafter, it draws each token from its own
q (argmax for greedy; its warped softmax, reported as q, when sampling), and the verifier's rule keeps the
output the target's own whatever q is.

It is ``ModelDrafter`` with another model step: the KV of a session is the decoder's static cache, cropped
on rollback and fed in place (as a shared-buffer ONNX graph's is), so the block, check and sync logic is
the ONNX kind's. Every forward runs on one OS thread (``verifier_service.torch_thread``), as the verifier's do.
This kind imports torch and the verifier's decoder: the drafter box installs what the target box does, and
the ONNX kinds stay torch-free.

    drafter_service.factory.load_drafter("/models/SmolLM2-135M-Instruct.Q4_1.gguf", threads=1)
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import numpy as np
import torch

from drafter_service import suffix_store
from drafter_service.drafter import DEFAULT_MAX_SESSIONS
from drafter_service.guesses import GuessCounts, Habits
from drafter_service.model_drafter import (DEFAULT_PREFILL_CHUNK, METADATA_FILE, DrafterMetadata, ModelDrafter,
                                           ModelState)
from tandem.sessions import SessionStore
from tandem.types import ModelInfo
from verifier_service import quant, torch_thread

log = logging.getLogger(__name__)

DEFAULT_ACTIVATIONS = "int8"
DEFAULT_GUESSES = 1         # tokens guessed after each drafted token (drafter_service.guesses)
DEFAULT_LONG_GUESSES = 7    # ... where the text loops: one forward of 8 rows
DEFAULT_GUESS_SEED = "auto"  # text the drafter's habits start from (habit_seeds)
_load_lock = threading.Lock()     # the activation arithmetic is read from the environment while loading


def habit_seeds(seed: str | None, vocab_hash: str) -> list[Path]:
    """The files a .gguf drafter's habits (drafter_service.guesses.Habits) start from: 'auto' = the suffix seeds
    (``suffix_seed.jsonl.gz``: its target's answers to training questions) of the shipped drafters whose
    vocabulary is this model's (their drafter.json's vocab_hash); None, '' or 'none' = none; else
    comma-separated files (drafter_service.suffix_store's format), each of which must exist."""
    from drafter_service.factory import SEED_FILE, seed_paths
    from tandem.defaults import DRAFTER_DIRS

    if seed in (None, "", "none"):
        return []
    if seed != "auto":
        files = [f.expanduser() for f in seed_paths(seed)]
        for f in files:
            if not f.is_file():
                raise FileNotFoundError(f"--drafter-guess-seed {f}: no such file")
        return files
    found = []
    for base in DRAFTER_DIRS:
        for meta in sorted(base.glob(f"*/{METADATA_FILE}")):
            try:
                same = vocab_hash and json.loads(meta.read_text()).get("vocab_hash") == vocab_hash
            except (OSError, ValueError):
                continue
            if same and (meta.parent / SEED_FILE).is_file():
                found.append(meta.parent / SEED_FILE)
        if found:
            return found[:1]                # the checkout's copy before the installed package data's
    return found


class DecoderKV:
    """One session's K/V in the decoder's static cache, with the interface ``ModelDrafter`` uses for a
    shared-buffer graph's (``length``, ``crop``, ``run``, ``nbytes``)."""

    __slots__ = ("drafter", "cache")

    def __init__(self, drafter: GgufDrafter):
        self.drafter = drafter
        self.cache = None               # made on the first feed (on the torch thread)

    @property
    def length(self) -> int:
        return 0 if self.cache is None else self.cache.length

    @property
    def nbytes(self) -> int:
        return 0 if self.cache is None else self.cache.nbytes()

    def crop(self, length: int) -> None:
        if self.cache is not None:
            self.cache.crop(int(length))

    def run(self, ids, keep: int = 1) -> np.ndarray:
        """Feeds ``ids`` after the held tokens; returns the logits of the last ``keep`` rows [1, keep, vocab]."""
        return self.drafter.feed(self, [int(i) for i in ids], max(1, int(keep)))


class GgufDrafter(ModelDrafter):
    """Proposes draft blocks with the verifier's decoder over a GGUF file, int8 activations by default."""

    kind = "gguf"
    can_check = True

    def __init__(self, model_path, *, threads: int | None = None, activations: str = DEFAULT_ACTIVATIONS,
                 support_size: int = 64, session_ttl_s: float = 600.0,
                 max_sessions: int | None = DEFAULT_MAX_SESSIONS, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 guesses: int = DEFAULT_GUESSES, long_guesses: int = DEFAULT_LONG_GUESSES,
                 guess_seed: str | None = DEFAULT_GUESS_SEED, providers=None):
        """``threads``: the forward's threads (None: torch's default); ``activations``: 'int8' (llama.cpp's
        arithmetic, the fast one) or 'fp32' (the target's default arithmetic: every greedy token the target's,
        at the target's cost); ``guesses``: tokens guessed beside each drafted one (drafter_service.guesses);
        ``long_guesses``: where the session's text loops (0: ``guesses`` there too);
        ``guess_seed``: the text its habits start from (``habit_seeds``). ``providers`` is an ONNX kind's option
        and is ignored."""
        from verifier_service.target import Target

        path = Path(model_path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"drafter model {path} not found")
        activations = quant.activation_mode(activations)
        if threads:
            torch_thread.run(torch.set_num_threads, int(threads))
        with _load_lock:
            before = os.environ.get(quant.ACTIVATIONS_ENV)
            os.environ[quant.ACTIVATIONS_ENV] = activations
            try:
                self.target = Target.load(str(path), widths=[1, 2, 4])
            finally:
                if before is None:
                    os.environ.pop(quant.ACTIVATIONS_ENV, None)
                else:
                    os.environ[quant.ACTIVATIONS_ENV] = before
        self.decoder = self.target.decoder
        if self.decoder is None:
            raise ValueError(f"{path}: {self.target.startup_line()} -- a gguf drafter needs the GGUF fast path "
                             "(transformers' forward would draft slower than the target verifies)")
        self.prefill_chunk = max(0, int(prefill_chunk or 0))
        self.guess_tokens = max(0, int(guesses))
        self.long_guesses = max(0, int(long_guesses)) if self.guess_tokens else 0
        self._shared = self                     # the KV is fed in place: ModelDrafter's shared-buffer branch
        info = self.target.info
        self.activations = activations
        self.meta = DrafterMetadata(model_name=f"{info.model_name} ({activations} activations)", num_layers=0,
                                    num_kv_heads=0, head_dim=0, vocab_size=int(info.vocab_size),
                                    logits_size=int(info.vocab_size), vocab_hash=info.vocab_hash,
                                    eos_token_ids=tuple(info.eos_token_ids), max_context=int(info.max_context),
                                    draft_vocab=None)
        self._info = ModelInfo(self.meta.model_name, self.meta.vocab_size, self.meta.vocab_hash,
                               self.meta.max_context, self.meta.eos_token_ids, follow_path=True)
        if self.guess_tokens:
            self.guess_counts = GuessCounts()
            self.habits = Habits()
            for seed in habit_seeds(guess_seed, info.vocab_hash):
                pairs = self.habits.learn_text(suffix_store.read_sequences(seed))
                log.info("drafter habits: %d token pairs from %s", pairs, seed)
        self.support_size = int(support_size)
        self.sessions: SessionStore[ModelState] = SessionStore(session_ttl_s, max_sessions=max_sessions,
                                                            what="drafter session")
        log.info("drafter %s: %s", self.meta.model_name, self.target.startup_line())

    def _empty_kv(self) -> list:
        return [DecoderKV(self)]

    def feed(self, kv: DecoderKV, ids: list[int], keep: int) -> np.ndarray:
        """Runs ``ids`` after ``kv``'s tokens on the torch thread; the last ``keep`` rows' logits [1, keep, V]."""
        return torch_thread.run(self._feed_now, kv, ids, keep)

    def _feed_now(self, kv: DecoderKV, ids: list[int], keep: int) -> np.ndarray:
        with torch.inference_mode():
            if kv.cache is None:
                kv.cache = self.decoder.new_cache()
            rows = self.decoder.forward_blocks([(kv.cache, ids)], [min(keep, len(ids))])[0]
            return rows.numpy()[None]
