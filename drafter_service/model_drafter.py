"""The ``model`` drafter kind: an ONNX causal LM with a KV cache per session, proposing draft blocks.

The model is a decoder-with-past ONNX file as written by ``tandem export-drafter`` (inputs
``input_ids``, ``attention_mask``, ``position_ids``, ``past_key_values.{i}.key/value``; outputs
``logits``, ``present.{i}.key/value``), with ``drafter.json`` beside it::

    {"format": "tandem-drafter/1", "kind": "model", "model_name", "num_layers", "num_kv_heads", "head_dim",
     "vocab_size", "logits_size", "vocab_hash", "eos_token_ids", "max_context", "draft_vocab"}

``vocab_size`` is the target vocabulary the token ids live in (input ids and proposed ids).
``draft_vocab`` is null, or the name of an int64 .npy file beside the model mapping each logit index
to a target token id, for drafters whose output head covers a reduced vocabulary (their input
embedding still takes target ids). Without ``drafter.json`` the shapes are read from the graph, the
vocabulary hash is "" (so a gateway cannot check compatibility), no EOS ids are known and
``max_context`` is 0 (unknown: not enforced).

A graph written by ``tandem.export_shared_kv`` (``"kv_cache": "shared"``; inputs ``input_ids``,
``past_key_values.{i}.key/value``, ``seqlens_k``, ``total_sequence_length``, ``logits_to_keep``) keeps
each session's KV in buffers bound in place as both past and present (drafter_service.kv_buffers): a
drafted token copies no cache, a rollback only shortens the length, and a feed of n tokens computes the
head for the rows it returns only. The classic graph returns a new concatenated KV on every run.

Per session the drafter keeps the KV (numpy arrays, or the session's shared buffers) with the token ids
it holds. Each block crops the KV to the longest common prefix with the new context (the rollback to the
accepted prefix), feeds the rest, then drafts k tokens one at a time. Long contexts are fed in runs of
``prefill_chunk`` tokens: attention over n new tokens in one run costs memory (and, in ORT's CPU
kernels, time) quadratic in n; a 4 000-token prompt takes ~4-5 s and 3.3 GB in one run, ~0.6 s and
0.5 GB in 512-token runs on a 2-core CPU. No torch here.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from drafter_service.drafter import DEFAULT_MAX_SESSIONS, ContextDrafter, Decide, DraftState
from drafter_service.guesses import LONG_MATCH, Continuations, GuessCounts, Habits, common_prefix
from drafter_service.kv_buffers import SHARED_KV_INPUTS, SharedKV, SharedKVGraph
from drafter_service.sampling import coupled_draft, sample_index, top_probability, truncate_support, warp
from tandem.sessions import SessionStore
from tandem.types import DraftToken, ModelInfo, SamplingParams

log = logging.getLogger(__name__)

MODEL_FILE = "model.onnx"
METADATA_FILE = "drafter.json"
DRAFTER_FORMAT = "tandem-drafter/1"
DEFAULT_PREFILL_CHUNK = 512


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


class ModelState(DraftState):
    """A session of the model drafter: its KV (the graph's past values: 2 x layers numpy arrays, or one
    ``SharedKV`` for a shared-buffer graph), the ids it holds, and (after check_tokens) the logits row
    predicting the token after ``kv_ids``."""

    __slots__ = ("kv", "kv_ids", "next_logits", "guessed", "guessed_rows", "guess_source", "continuations")

    def __init__(self, empty_kv: list):
        super().__init__()
        self.kv: list = empty_kv
        self.kv_ids: list[int] = []
        self.next_logits: np.ndarray | None = None
        self.guessed: list[int] = []                # tokens the KV holds after kv_ids, fed as guesses
        self.guessed_rows: list[np.ndarray] = []    # the logits row after each of them
        self.guess_source = ""                      # where they came from (GuessCounts.SOURCES)
        self.continuations: Continuations | None = None     # made by the first guessed step

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.kv)


def resolve_paths(model_path) -> tuple[Path, Path]:
    """(the .onnx file, the drafter.json beside it) of a drafter file or directory."""
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
    positions = session.get_modelmeta().custom_metadata_map.get("max_positions")   # a shared-buffer graph's
    return {"model_name": onnx_path.parent.name or onnx_path.stem, "num_layers": layers, "num_kv_heads": kv_heads,
            "head_dim": head_dim, "vocab_size": vocab, "logits_size": vocab, "vocab_hash": "",
            "eos_token_ids": [], "max_context": int(positions or 0), "draft_vocab": None}


def _is_shared_kv(session) -> bool:
    """Whether the graph keeps its KV in buffers shared by past and present (tandem.export_shared_kv)."""
    return "seqlens_k" in {i.name for i in session.get_inputs()}


def _shared_kv_graph(session, onnx_path: Path, past_names: list[str], kv_shape: tuple[int, int, int], dtype,
                     max_context: int) -> SharedKVGraph:
    logits = {o.name: o for o in session.get_outputs()}["logits"].shape
    positions = int(session.get_modelmeta().custom_metadata_map.get("max_positions") or max_context)
    if not isinstance(logits[-1], int) or positions <= 0:
        raise ValueError(f"{onnx_path}: a shared-buffer graph needs a static logits width and its max_positions "
                         f"(got logits {logits}, max_positions {positions}); rewrite it with tandem.export_shared_kv")
    heads, dim, _ = kv_shape
    return SharedKVGraph(session, tuple(past_names), heads, dim, dtype, int(logits[-1]), positions)


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


class ModelDrafter(ContextDrafter):
    """Proposes draft blocks with an ONNX decoder; thread-safe (one proposal per session at a time)."""

    kind = "model"
    can_check = True
    guess_tokens = 0        # tokens guessed after each fed draft token (drafter_service.guesses); 0: none
    long_guesses = 0        # ... where the text loops (the last LONG_MATCH tokens recur), if more
    habits: Habits | None = None    # what it drafted after each token, the guess where the text has none
    guess_counts: GuessCounts | None = None     # guessed rows fed and used, by source (its metrics read them)

    def __init__(self, model_path, *, threads: int | None = None, providers: list[str] | None = None,
                 support_size: int = 64, session_ttl_s: float = 600.0,
                 max_sessions: int | None = DEFAULT_MAX_SESSIONS, prefill_chunk: int = DEFAULT_PREFILL_CHUNK):
        """``prefill_chunk``: the most tokens fed in one ONNX run (0: everything in one run)."""
        import onnxruntime as ort

        self.onnx_path, meta_path = resolve_paths(model_path)
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
        if _is_shared_kv(self.session) and not providers and self.session.get_providers()[0] != "CPUExecutionProvider":
            # its fp32 GroupQueryAttention runs on the CPU provider only: no device copies for every token
            self.session = ort.InferenceSession(str(self.onnx_path), opts, providers=["CPUExecutionProvider"])
        self.providers = self.session.get_providers()

        raw = json.loads(meta_path.read_text()) if meta_path.exists() else _graph_metadata(self.session, self.onnx_path)
        if meta_path.exists() and raw.get("format", DRAFTER_FORMAT) != DRAFTER_FORMAT:
            raise ValueError(f"{meta_path}: unsupported format {raw.get('format')!r} (expected {DRAFTER_FORMAT})")
        if raw.get("kind", self.kind) != self.kind:
            raise ValueError(f"{meta_path}: kind {raw.get('kind')!r} is not an ONNX model drafter "
                             "(load it with drafter_service.factory.load_drafter)")
        self._input_names = [i.name for i in self.session.get_inputs()]
        self._output_names = [o.name for o in self.session.get_outputs()]
        layers = int(raw["num_layers"])
        self._past_names = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
        shared = _is_shared_kv(self.session)
        wanted_inputs = SHARED_KV_INPUTS if shared else ("input_ids", "attention_mask", "position_ids")
        missing = [n for n in (*wanted_inputs, *self._past_names) if n not in self._input_names]
        if missing or self._output_names[0] != "logits":
            raise ValueError(f"{self.onnx_path}: not the decoder-with-past layout tandem expects "
                             f"(missing inputs {missing}, outputs {self._output_names[:3]}...)")
        self._present_names = ["logits"] + [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
        past_type = {i.name: i.type for i in self.session.get_inputs()}[self._past_names[0]]
        self._kv_dtype = np.float16 if "float16" in past_type else np.float32
        self._kv_shape = (int(raw["num_kv_heads"]), int(raw["head_dim"]), layers)
        self.prefill_chunk = max(0, int(prefill_chunk or 0))
        self._shared: SharedKVGraph | None = None
        if shared:
            self._shared = _shared_kv_graph(self.session, self.onnx_path, self._past_names, self._kv_shape,
                                            self._kv_dtype, int(raw.get("max_context") or 0))

        draft_vocab = None
        if raw.get("draft_vocab"):
            draft_vocab = np.load(self.onnx_path.parent / raw["draft_vocab"]).astype(np.int64)
        logits_size = raw.get("logits_size") or raw.get("vocab_size")
        vocab_size = raw.get("vocab_size")
        if logits_size is None:  # graph without static vocab dim: ask the model once
            logits_size = self._run([0], self._empty_kv())[0].shape[-1]
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
        self.sessions: SessionStore[ModelState] = SessionStore(session_ttl_s, max_sessions=max_sessions,
                                                            what="drafter session")
        log.info("drafter %s: %d layers, vocab %d, providers %s", self.meta.model_name, layers,
                 self.meta.vocab_size, self.providers)

    @property
    def info(self) -> ModelInfo:
        return self._info

    def new_state(self) -> ModelState:
        return ModelState(self._empty_kv())

    def drop_cache(self, state: ModelState) -> None:
        state.kv, state.kv_ids, state.next_logits = self._empty_kv(), [], None
        state.guessed.clear()
        state.guessed_rows.clear()

    # ------------------------------------------------------------------------------ drafting

    def draft_block(self, state: ModelState, context: list[int], k: int, sampling: SamplingParams,
                    min_confidence: float = 0.0, *, offset: int = 0) -> list[DraftToken]:
        guessing = self.guess_tokens > 0 and self._shared is not None
        guessed, guessed_rows = state.guessed, state.guessed_rows
        logits = self._resume(state, context)
        if logits is None and guessing and not guessed and len(context) == len(state.kv_ids) + 1 \
                and context[:-1] == state.kv_ids:   # the last block's last token: fed with a guess of the next
            logits = self._feed_guessing(state, context[-1])
        elif logits is None:
            logits = self._sync(state, context, 1)[-1]
        state.next_logits = None
        rng = None if sampling.greedy or sampling.coupled else state.generator(sampling.seed)
        dv = self.meta.draft_vocab
        tokens: list[DraftToken] = []
        for j in range(k):
            step = offset + j                   # position in the whole block
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
                if sampling.coupled:            # the token's index in the whole sequence: len(context) + j
                    choice = coupled_draft(logits, ids, probs, sampling, len(context) + j, dv)
                else:
                    choice = sample_index(probs, rng)
                if dv is not None:
                    ids = dv[ids]
                tok = (DraftToken(int(ids[choice])) if sampling.coupled      # the verifier never reads q then
                       else DraftToken(int(ids[choice]), tuple(ids.tolist()), tuple(probs.tolist())))
            tokens.append(tok)
            if self.habits is not None:
                self.habits.learn(tokens[-2].token_id if j else context[-1], tok.token_id)
            if j < k - 1:
                if state.stop is not None and state.stop():
                    break                       # the caller dropped this block's path: the rest would be void
                if not guessing:
                    outs = self._run([tok.token_id], state.kv)
                    state.kv = outs[1:]
                    state.kv_ids.append(tok.token_id)
                    logits = outs[0][0, -1]
                    continue
                if guessed and guessed[0] == tok.token_id:     # fed already: its row is the next logits
                    self._guess_used(state, 1)
                    guessed.pop(0)
                    logits = guessed_rows.pop(0)
                    state.kv_ids.append(tok.token_id)
                    continue
                if guessed:                     # a wrong guess: drop its rows and those after it
                    self._drop_guesses(state)
                logits = self._feed_guessing(state, tok.token_id)
        if guessed:
            unfed = len(state.kv_ids) < len(context) + len(tokens)      # the block's last token (not fed)
            if unfed and tokens[-1].token_id == guessed[0]:     # fed as a guess: the next block starts after it
                self._guess_used(state, 1)
                state.kv_ids.append(guessed.pop(0))
                state.next_logits = guessed_rows.pop(0)
            else:
                self._drop_guesses(state)
        return tokens

    def _resume(self, state: ModelState, context: list[int]) -> np.ndarray | None:
        """The logits after ``context`` where the session's KV holds it already (fed by check_tokens, or by the
        last block and the guesses after it, drafter_service.guesses), the KV then holding ``context``; else
        None (``_sync`` feeds it)."""
        if state.next_logits is None:
            return None
        held = len(state.kv_ids)
        extra = len(context) - held
        if not 0 <= extra <= len(state.guessed) or context[:held] != state.kv_ids \
                or context[held:] != state.guessed[:extra]:
            return None
        logits = state.next_logits if extra == 0 else state.guessed_rows[extra - 1]
        self._guess_used(state, extra)
        state.kv_ids.extend(context[held:])
        del state.guessed[:extra], state.guessed_rows[:extra]
        return logits

    def _drop_guesses(self, state: ModelState) -> None:
        """Crops the guessed tokens the KV holds after kv_ids."""
        state.kv = self._crop(state.kv, len(state.kv_ids))
        state.guessed.clear()
        state.guessed_rows.clear()

    def _feed_guessing(self, state: ModelState, token: int) -> np.ndarray:
        """Feeds ``token`` after kv_ids with the guesses of what follows it (drafter_service.guesses); returns
        the logits after ``token``, the guesses' rows kept in the state."""
        guesses = self._guesses(state, token, self.guess_tokens)
        if guesses and self.guess_counts is not None:
            self.guess_counts.fed[state.guess_source] += len(guesses)
        rows = state.kv[0].run([token, *guesses], 1 + len(guesses))[0]
        state.kv_ids.append(token)
        state.guessed.extend(guesses)
        state.guessed_rows.extend(rows[1:])
        return rows[0]

    def _guesses(self, state: ModelState, token: int, m: int) -> list[int]:
        """Up to ``m`` tokens guessed to follow the session's tokens and ``token`` (drafter_service.guesses), or up
        to ``long_guesses`` where the text loops; never past the drafter's context (a guess takes a position in
        the KV)."""
        room = self.meta.max_context - len(state.kv_ids) - 1 if self.meta.max_context else m + self.long_guesses
        m, longer = min(m, room), min(max(m, self.long_guesses), room)
        if m <= 0:
            return []
        if state.continuations is None:
            state.continuations = Continuations()
        guesses, match = state.continuations.guess_matched([*state.kv_ids, token], longer)
        if match < LONG_MATCH:
            guesses = guesses[:m]
        state.guess_source = "session"
        if not guesses and self.habits is not None:
            guesses = self.habits.guess(token, m)
            state.guess_source = "habit"
        return guesses

    def _guess_used(self, state: ModelState, n: int) -> None:
        """``n`` guessed rows were the tokens that followed: counted by their source."""
        if n and self.guess_counts is not None:
            self.guess_counts.used[state.guess_source] += n

    def check_tokens(self, state: ModelState, context: list[int], tokens: list[int], decide: Decide) -> int:
        """One feed of context + tokens (re-feeding at least the last context token, whose logits row
        predicts tokens[0]); see ContextDrafter.check_tokens. A graph that returns the last position's
        logits only cannot check: every token is kept."""
        fed = context + tokens
        rows = self._sync(state, fed, len(tokens) + 1, rollback_to=len(context) - 1)
        if rows.shape[0] < len(tokens) + 1:
            state.next_logits = rows[-1]
            return len(tokens)
        tops = np.argmax(rows[:len(tokens)], axis=-1)
        top_ids = np.asarray([self._target_id(int(t)) for t in tops], dtype=np.int64)
        top_probs = np.asarray([top_probability(rows[j], int(t)) for j, t in enumerate(tops)], dtype=np.float64)
        kept = int(decide(top_ids, top_probs))
        if kept < len(tokens):                  # roll the KV back to context + the kept tokens
            end = len(context) + kept
            state.kv = self._crop(state.kv, end)
            state.kv_ids = fed[:end]
        state.next_logits = rows[kept]
        return kept

    # ------------------------------------------------------------------------------ internals

    def _sync(self, state: ModelState, ids: list[int], rows: int, rollback_to: int | None = None) -> np.ndarray:
        """Makes the KV hold ``ids``: keeps the longest common prefix of what it holds and ``ids`` (never more
        than ``rollback_to`` tokens, default len(ids) - 1: the last token is always re-fed, its logits start
        the draft), feeds the rest. Returns the logits rows of the last ``rows`` positions."""
        limit = len(ids) - 1 if rollback_to is None else rollback_to
        common = common_prefix(state.kv_ids, ids, min(len(state.kv_ids), limit))
        past = self._crop(state.kv, common) if common < self._kv_length(state.kv) else state.kv
        out, state.kv = self._feed(ids[common:], past, rows)
        state.kv_ids = list(ids)
        state.next_logits = None
        state.guessed.clear()
        state.guessed_rows.clear()
        return out

    def _feed(self, ids: list[int], past: list, rows: int = 1) -> tuple[np.ndarray, list]:
        """Feeds ``ids`` after ``past`` in runs of at most ``prefill_chunk`` tokens. Returns (the logits rows of
        the last ``rows`` positions [rows, logits_size] — one row for a graph returning the last position's
        logits only —, the KV after them). Only runs holding wanted rows ask the graph for logits rows."""
        n = len(ids)
        chunk = self.prefill_chunk or n
        wanted_from = n - rows
        parts: list[np.ndarray] = []
        for start in range(0, n, chunk):
            end = min(n, start + chunk)
            wanted = end - max(start, wanted_from)          # rows of this run that are returned
            if self._shared is not None:                     # logits for the wanted rows only
                outs = [past[0].run(ids[start:end], max(1, wanted)), past[0]]
            else:
                outs = self._run(ids[start:end], past)
            past = outs[1:]
            if wanted > 0:
                out = outs[0][0]
                if out.shape[0] >= wanted:
                    parts.append(out[out.shape[0] - wanted:])
                else:                           # last-position logits only
                    parts = [out[-1:]]
        out = parts[0] if len(parts) == 1 else np.concatenate(parts)
        if self._shared is not None and n - start == 1:
            out = out.copy()                    # not the session's step buffer, which its next step overwrites
        return out, past

    def _empty_kv(self) -> list:
        if self._shared is not None:
            return [SharedKV(self._shared)]
        heads, dim, layers = self._kv_shape
        return [np.zeros((1, heads, 0, dim), self._kv_dtype) for _ in range(2 * layers)]

    def _kv_length(self, kv: list) -> int:
        """How many tokens ``kv`` holds."""
        return kv[0].length if self._shared is not None else kv[0].shape[2]

    def _crop(self, kv: list, length: int) -> list:
        """``kv`` holding its first ``length`` tokens only (in place for shared buffers, a copy otherwise)."""
        if self._shared is not None:
            kv[0].crop(length)
            return kv
        return [np.ascontiguousarray(x[:, :, :length]) for x in kv]

    def _run(self, ids, past: list) -> list:
        """One ORT run: feeds ``ids`` after ``past``; returns [logits [1, rows, logits_size], the KV after it...]:
        every row from the classic graph; the last row from a shared-buffer graph (the KV is ``past``, advanced
        in place; a one-token step's logits are the session's step buffer, valid until its next run)."""
        if self._shared is not None:
            return [past[0].run(ids, 1), past[0]]
        p = past[0].shape[2]
        s = len(ids)
        feed = {"input_ids": np.asarray(ids, dtype=np.int64).reshape(1, s),
                "attention_mask": np.ones((1, p + s), dtype=np.int64),
                "position_ids": np.arange(p, p + s, dtype=np.int64).reshape(1, s)}
        feed.update(zip(self._past_names, past))
        return self.session.run(self._present_names, feed)

    def _target_id(self, idx: int) -> int:
        """The target token id of drafter logit index ``idx`` (through the draft vocabulary, if any)."""
        dv = self.meta.draft_vocab
        return int(dv[idx]) if dv is not None else idx
