"""The drafter: an ONNX causal LM with a KV cache per session, proposing draft blocks.

The model is a decoder-with-past ONNX file as written by ``tandem export-drafter`` (inputs
``input_ids``, ``attention_mask``, ``position_ids``, ``past_key_values.{i}.key/value``; outputs
``logits``, ``present.{i}.key/value``), with ``drafter.json`` beside it::

    {"format": "tandem-drafter/1", "model_name", "num_layers", "num_kv_heads", "head_dim",
     "vocab_size", "logits_size", "vocab_hash", "eos_token_ids", "max_context", "draft_vocab"}

``vocab_size`` is the target vocabulary the token ids live in (input ids and proposed ids).
``draft_vocab`` is null, or the name of an int64 .npy file beside the model mapping each logit index
to a target token id, for drafters whose output head covers a reduced vocabulary (their input
embedding still takes target ids). Without ``drafter.json`` the shapes are read from the graph, the
vocabulary hash is "" (so a gateway cannot check compatibility), no EOS ids are known and
``max_context`` is 0 (unknown: not enforced).

Per session the drafter keeps the context it last saw (prompt + accepted tokens, never its own
drafts) and numpy KV arrays with the token ids they hold. Each ``propose`` crops the KV to the
longest common prefix with the new context (the rollback to the accepted prefix), feeds the rest in
one run, then drafts k tokens one at a time. No torch here.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from drafter_service.lookup import find_lookup
from drafter_service.sampling import sample_index, session_rng, top_probability, truncate_support, warp
from tandem.sessions import SessionStore
from tandem import telemetry
from tandem.types import DraftToken, ModelInfo, Proposal, SamplingParams

log = logging.getLogger(__name__)

MODEL_FILE = "model.onnx"
METADATA_FILE = "drafter.json"
DRAFTER_FORMAT = "tandem-drafter/1"


class UnknownSessionError(KeyError):
    """The session is unknown (or evicted), or knows fewer tokens than prefix_length.

    The caller recovers by resending the whole context with prefix_length 0.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown session"


@dataclass(frozen=True)
class DrafterMetadata:
    model_name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    logits_size: int
    vocab_hash: str
    eos_token_ids: tuple[int, ...]
    max_context: int
    draft_vocab: np.ndarray | None  # logit index -> target token id, or None (identity)


class _Session:
    """One session's state. ``lock`` serialises proposals on the same session."""

    __slots__ = ("lock", "context", "kv", "kv_ids", "rng", "rng_seed")

    def __init__(self, empty_kv: list[np.ndarray]):
        self.lock = threading.Lock()
        self.context: list[int] = []
        self.kv: list[np.ndarray] = empty_kv
        self.kv_ids: list[int] = []
        self.rng: np.random.Generator | None = None
        self.rng_seed: object = None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.kv)


def _resolve_paths(model_path) -> tuple[Path, Path]:
    path = Path(model_path).expanduser()
    if path.is_dir():
        onnx_path = path / MODEL_FILE
        if not onnx_path.exists():
            found = sorted(path.glob("*.onnx"))
            if len(found) != 1:
                raise FileNotFoundError(f"{path} holds no {MODEL_FILE}" +
                                        (f" (and {len(found)} other .onnx files)" if found else ""))
            onnx_path = found[0]
    else:
        onnx_path = path
    if not onnx_path.exists():
        raise FileNotFoundError(f"drafter model {onnx_path} not found")
    return onnx_path, onnx_path.parent / METADATA_FILE


def _graph_metadata(session, onnx_path: Path) -> dict:
    """Shapes read from the graph when drafter.json is missing."""
    inputs = {i.name: i for i in session.get_inputs()}
    layers = sum(1 for n in inputs if n.startswith("past_key_values.") and n.endswith(".key"))
    if layers == 0 or "past_key_values.0.key" not in inputs:
        raise ValueError(f"{onnx_path} is not a decoder-with-past model (no past_key_values.{{i}}.key inputs)")
    shape = inputs["past_key_values.0.key"].shape
    kv_heads, head_dim = shape[1], shape[3]
    if not (isinstance(kv_heads, int) and isinstance(head_dim, int)):
        raise ValueError(f"{onnx_path}: KV heads/head_dim are not static in the graph ({shape}); add {METADATA_FILE}")
    logits = {o.name: o for o in session.get_outputs()}["logits"].shape
    vocab = logits[-1] if isinstance(logits[-1], int) else None
    return {"model_name": onnx_path.parent.name or onnx_path.stem, "num_layers": layers, "num_kv_heads": kv_heads,
            "head_dim": head_dim, "vocab_size": vocab, "logits_size": vocab, "vocab_hash": "",
            "eos_token_ids": [], "max_context": 0, "draft_vocab": None}


def default_providers() -> list[str]:
    """CUDA if this onnxruntime build has it and an NVIDIA GPU is present, then CPU.

    onnxruntime-gpu lists CUDAExecutionProvider even on machines without a GPU; asking for it
    there only prints loader errors, so it is skipped unless a GPU device node exists.
    """
    import glob

    import onnxruntime as ort

    available = ort.get_available_providers()
    if not glob.glob("/dev/nvidia[0-9]*"):
        available = [p for p in available if p != "CUDAExecutionProvider"]
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


class OnnxDrafter:
    """Proposes draft blocks with an ONNX decoder; thread-safe (one proposal per session at a time)."""

    def __init__(self, model_path, *, threads: int | None = None, providers: list[str] | None = None,
                 support_size: int = 64, session_ttl_s: float = 600.0, max_sessions: int | None = None,
                 lookup_max_ngram: int = 0, lookup_min_ngram: int = 2, lookup_trust_ngram: int = 1,
                 lookup_check_confidence: float = 0.5):
        """``lookup_max_ngram`` > 0 turns on prompt lookup (drafter_service.lookup): draft tokens copied
        from the context when its last n-gram (n = max .. min) recurs, the model drafting the rest.
        Tokens found by an n-gram shorter than ``lookup_trust_ngram`` are checked against the model: kept
        while its top token agrees or its top probability is below ``lookup_check_confidence``."""
        import onnxruntime as ort

        self.onnx_path, meta_path = _resolve_paths(model_path)
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = int(threads)
            opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        wanted = list(providers) if providers else default_providers()
        try:
            self.session = ort.InferenceSession(str(self.onnx_path), opts, providers=wanted)
        except Exception as exc:  # noqa: BLE001 - e.g. CUDA listed but its libraries missing
            if wanted == ["CPUExecutionProvider"] or providers:
                raise
            log.warning("ONNX Runtime providers %s failed (%s); using CPU", wanted, exc)
            self.session = ort.InferenceSession(str(self.onnx_path), opts, providers=["CPUExecutionProvider"])
        self.providers = self.session.get_providers()

        raw = json.loads(meta_path.read_text()) if meta_path.exists() else _graph_metadata(self.session, self.onnx_path)
        if meta_path.exists() and raw.get("format", DRAFTER_FORMAT) != DRAFTER_FORMAT:
            raise ValueError(f"{meta_path}: unsupported format {raw.get('format')!r} (expected {DRAFTER_FORMAT})")
        self._input_names = [i.name for i in self.session.get_inputs()]
        self._output_names = [o.name for o in self.session.get_outputs()]
        layers = int(raw["num_layers"])
        self._past_names = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
        missing = [n for n in ("input_ids", "attention_mask", "position_ids", *self._past_names)
                   if n not in self._input_names]
        if missing or self._output_names[0] != "logits":
            raise ValueError(f"{self.onnx_path}: not the decoder-with-past layout tandem expects "
                             f"(missing inputs {missing}, outputs {self._output_names[:3]}...)")
        self._present_names = ["logits"] + [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
        self._use_position_ids = "position_ids" in self._input_names
        kv_dtype = np.float16 if "float16" in self.session.get_inputs()[3].type else np.float32
        self._kv_dtype = kv_dtype

        draft_vocab = None
        if raw.get("draft_vocab"):
            draft_vocab = np.load(self.onnx_path.parent / raw["draft_vocab"]).astype(np.int64)
        logits_size = raw.get("logits_size") or raw.get("vocab_size")
        vocab_size = raw.get("vocab_size")
        if logits_size is None:  # graph without static vocab dim: ask the model once
            logits_size = self._run([0], self._empty_kv(layers, raw))[0].shape[-1]
            vocab_size = vocab_size or logits_size
        if draft_vocab is not None:
            if draft_vocab.ndim != 1 or draft_vocab.shape[0] != int(logits_size):
                raise ValueError(f"draft_vocab has shape {draft_vocab.shape}, expected [{logits_size}]")
            if draft_vocab.min() < 0 or draft_vocab.max() >= int(vocab_size):
                raise ValueError(f"draft_vocab maps to ids outside [0, {vocab_size})")
        self.meta = DrafterMetadata(
            model_name=str(raw.get("model_name") or self.onnx_path.parent.name),
            num_layers=layers, num_kv_heads=int(raw["num_kv_heads"]), head_dim=int(raw["head_dim"]),
            vocab_size=int(vocab_size), logits_size=int(logits_size), vocab_hash=str(raw.get("vocab_hash") or ""),
            eos_token_ids=tuple(int(i) for i in raw.get("eos_token_ids") or ()),
            max_context=int(raw.get("max_context") or 0), draft_vocab=draft_vocab)
        self._info = ModelInfo(self.meta.model_name, self.meta.vocab_size, self.meta.vocab_hash,
                               self.meta.max_context, self.meta.eos_token_ids)
        self.support_size = int(support_size)
        self.lookup_max_ngram, self.lookup_min_ngram = int(lookup_max_ngram), max(1, int(lookup_min_ngram))
        self.lookup_trust_ngram = int(lookup_trust_ngram)
        if not 0.0 <= lookup_check_confidence <= 1.0:
            raise ValueError(f"lookup_check_confidence must be in [0, 1], got {lookup_check_confidence}")
        self.lookup_check_confidence = float(lookup_check_confidence)
        self.sessions: SessionStore[_Session] = SessionStore(session_ttl_s, max_sessions=max_sessions,
                                                          what="drafter session")
        log.info("drafter %s: %d layers, vocab %d, providers %s", self.meta.model_name, layers,
                 self.meta.vocab_size, self.providers)

    # ------------------------------------------------------------------------------ public API

    @property
    def info(self) -> ModelInfo:
        return self._info

    def propose(self, session_id: str, prefix_length: int, appended_tokens, k: int,
                sampling: SamplingParams | None = None, min_confidence: float = 0.0) -> Proposal:
        """Syncs the session to (first ``prefix_length`` known tokens + ``appended_tokens``), drafts k tokens.

        ``min_confidence`` > 0 ends the block early (an adaptive draft length): before a model draft
        token whose position's top probability is below it. At least one token is always proposed.

        Raises UnknownSessionError for an unknown session with prefix_length > 0 or a prefix longer
        than the session knows, ValueError for bad arguments.
        """
        t0 = time.perf_counter()
        sampling = sampling or SamplingParams()
        sampling.validate()
        k = int(k)
        prefix_length = int(prefix_length)
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        min_confidence = float(min_confidence)
        if not 0.0 <= min_confidence <= 1.0:
            raise ValueError(f"min_confidence must be in [0, 1], got {min_confidence}")
        if prefix_length < 0:
            raise ValueError(f"prefix_length must be >= 0, got {prefix_length}")
        appended = [int(t) for t in appended_tokens]
        vocab = self.meta.vocab_size
        bad = [t for t in appended if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token ids out of the vocabulary [0, {vocab}): {bad[:5]}")

        if prefix_length > 0:
            session = self.sessions.get(session_id)
            if session is None:
                raise UnknownSessionError(f"unknown drafter session {session_id!r} (prefix_length "
                                          f"{prefix_length}): resend the whole context with prefix_length 0")
        else:
            session, _ = self.sessions.get_or_create(session_id, lambda: _Session(self._empty_kv()))

        with session.lock:
            if prefix_length > len(session.context):
                raise UnknownSessionError(f"drafter session {session_id!r} knows {len(session.context)} tokens, "
                                          f"not {prefix_length}: resend the whole context with prefix_length 0")
            context = session.context[:prefix_length] + appended
            if not context:
                raise ValueError("empty context: a new session needs at least one token")
            max_ctx = self.meta.max_context
            if max_ctx and len(context) + k - 1 > max_ctx:
                raise ValueError(f"context of {len(context)} tokens + k={k} drafts exceeds the drafter's "
                                 f"max_context {max_ctx}")
            session.context = context
            with telemetry.span("draft", {"tandem.k": k, "tandem.context_tokens": len(context),
                                          "tandem.onnxruntime.runs": k}):
                tokens = self._draft(session, context, k, sampling, min_confidence)
        self.sessions.touch(session_id)
        return Proposal(tokens=tuple(tokens), compute_ms=(time.perf_counter() - t0) * 1000.0)

    def end_session(self, session_id: str) -> bool:
        """Frees a session's KV cache; False if it was unknown."""
        return self.sessions.pop(session_id) is not None

    def evict_idle(self, now: float | None = None) -> list[str]:
        """Frees sessions idle for longer than session_ttl_s; returns their ids."""
        return self.sessions.evict_idle(now)

    def session_count(self) -> int:
        return self.sessions.count()

    def kv_bytes(self) -> int:
        """Bytes of KV cache held by all sessions."""
        return self.sessions.total_bytes()

    # ------------------------------------------------------------------------------ internals

    def _empty_kv(self, layers: int | None = None, raw: dict | None = None) -> list[np.ndarray]:
        if raw is not None:
            heads, dim = int(raw["num_kv_heads"]), int(raw["head_dim"])
        else:
            layers, heads, dim = self.meta.num_layers, self.meta.num_kv_heads, self.meta.head_dim
        dtype = getattr(self, "_kv_dtype", np.float32)
        return [np.zeros((1, heads, 0, dim), dtype) for _ in range(2 * layers)]

    def _run(self, ids, past: list[np.ndarray]) -> list[np.ndarray]:
        """One ORT run: feeds ``ids`` after ``past``; returns [logits, present...]."""
        p = past[0].shape[2]
        s = len(ids)
        feed = {"input_ids": np.asarray(ids, dtype=np.int64).reshape(1, s),
                "attention_mask": np.ones((1, p + s), dtype=np.int64),
                "position_ids": np.arange(p, p + s, dtype=np.int64).reshape(1, s)}
        feed.update(zip(self._past_names, past))
        return self.session.run(self._present_names, feed)

    def _draft(self, session: _Session, context: list[int], k: int, sampling: SamplingParams,
               min_confidence: float = 0.0) -> list[DraftToken]:
        # Rollback: keep the KV of the longest common prefix of what it holds and the new context,
        # but always re-feed at least the last context token (its logits start the draft).
        held = session.kv_ids
        n = min(len(held), len(context) - 1)
        common = 0
        if n > 0:
            a = np.asarray(held[:n])
            b = np.asarray(context[:n])
            diff = np.flatnonzero(a != b)
            common = int(diff[0]) if diff.size else n
        if common < session.kv[0].shape[2]:
            past = [np.ascontiguousarray(x[:, :, :common]) for x in session.kv]
        else:
            past = session.kv
        # Free draft tokens copied from the context first (q = point mass); the model drafts the rest.
        looked, ngram = (find_lookup(context, k, self.lookup_max_ngram, self.lookup_min_ngram)
                         if self.lookup_max_ngram else ([], 0))
        checked = bool(looked) and ngram < self.lookup_trust_ngram
        if len(looked) == k and not checked:
            return self._lookup_tokens(looked, sampling)   # no model run: the KV catches up next time
        fed = context + looked
        outs = self._run(fed[common:], past)
        rows = outs[0][0]            # [len(fed) - common, logits_size]; row r predicts position common + r + 1
        first = len(context) - 1 - common   # the row that predicts the first draft position
        per_position = rows.shape[0] == len(fed) - common   # False: a graph that returns the last logits only
        kept = self._checked_length(looked, rows[first:]) if checked and per_position else len(looked)
        if kept < len(looked):       # a confident disagreement: drop the rest of the lookup, roll the KV back
            end = len(context) + kept
            session.kv, session.kv_ids = [np.ascontiguousarray(x[:, :, :end]) for x in outs[1:]], list(fed[:end])
        else:
            session.kv, session.kv_ids = outs[1:], list(fed)
        tokens = self._lookup_tokens(looked[:kept], sampling)
        if len(tokens) == k:
            return tokens
        logits = rows[first + kept] if kept < len(looked) else rows[-1]

        if not sampling.greedy and (session.rng is None or session.rng_seed != sampling.seed):
            session.rng, session.rng_seed = session_rng(sampling.seed), sampling.seed
        dv = self.meta.draft_vocab
        for step in range(len(tokens), k):
            if sampling.greedy:
                idx = int(np.argmax(logits))
                if min_confidence and step and top_probability(logits, idx) < min_confidence:   # confidence stop
                    break
                tok = DraftToken(self._target_id(idx))
            else:
                warped = warp(logits, sampling)
                if min_confidence and step and float(warped.max()) < min_confidence:
                    break
                ids, probs = truncate_support(warped, self.support_size)
                choice = sample_index(probs, session.rng)
                if dv is not None:
                    ids = dv[ids]
                tok = DraftToken(int(ids[choice]), tuple(ids.tolist()), tuple(probs.tolist()))
            tokens.append(tok)
            if step < k - 1:
                outs = self._run([tok.token_id], session.kv)
                session.kv = outs[1:]
                session.kv_ids.append(tok.token_id)
                logits = outs[0][0, -1]
        return tokens

    @staticmethod
    def _lookup_tokens(ids: list[int], sampling: SamplingParams) -> list[DraftToken]:
        """Lookup tokens as proposals: q is a point mass on each."""
        return [DraftToken(t) if sampling.greedy else DraftToken(t, (t,), (1.0,)) for t in ids]

    def _checked_length(self, looked: list[int], rows: np.ndarray) -> int:
        """How many lookup tokens survive the model check: token j is kept while the model's top token at
        its position (``rows[j]``, the logits given the context and the kept tokens before it) is the same
        token, or the model's top probability there is below ``lookup_check_confidence``."""
        for j, tok in enumerate(looked):
            top = int(np.argmax(rows[j]))
            if self._target_id(top) != tok and top_probability(rows[j], top) >= self.lookup_check_confidence:
                return j
        return len(looked)

    def _target_id(self, idx: int) -> int:
        """The target token id of drafter logit index ``idx`` (through the draft vocabulary, if any)."""
        dv = self.meta.draft_vocab
        return int(dv[idx]) if dv is not None else idx


def load(model_path: str | os.PathLike, **kwargs) -> OnnxDrafter:
    """Shorthand for ``OnnxDrafter(model_path, **kwargs)``."""
    return OnnxDrafter(model_path, **kwargs)
