"""The model side of a target: which path runs it and why, loading it, one forward, warm-up and cost table.

``TargetModel`` is what ``verifier_service.target.Target`` (the sessions, the scheduler's work, the
acceptance rule and the rollback) runs its forwards on. It is kept apart because choosing and loading a
path is one concern with its own reasons (the start-up line says them), and the forward over a session's
cache is the same call whichever path runs it; what a forward is *for* lives in ``target``.

The fast path (a GGUF file of an architecture in ``verifier_service.architecture``, on CPU): the file is
read once into the decoder's layout (``gguf_model``: block weights stay in the file's memory map, read by
the C kernels; no fp32 copy), and ``verifier_service.decoder`` runs the layer math over an op backend with a
static KV cache (rollback = move the length back); verify-block rows attend row by row, so each row of a
verify block is bit-identical to a plain step. A Hugging Face directory of a Llama-family model runs the
same decoder over the model's fp32 weights (``static_decoder``; GEMMs on oneDNN's packed weights or MKL,
chosen per width by measurement: ``fast_linear``). Anything else (another architecture, a GPU, another
dtype) keeps transformers' forward with the same GEMMs and row-wise attention (``verifier_service.forward``);
``gemm="mkl"`` (without ``decoder="static"``) is plain transformers. Loading and every forward run on the
torch thread (``verifier_service.torch_thread``: why).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Self

import torch

from tandem import phases as loading
from tandem.models import model_device
from tandem.types import ModelInfo, SamplingParams
from verifier_service import fast_linear, static_decoder, torch_thread
from verifier_service.decoder import Decoder
from verifier_service.info import TokenizerInfo
from verifier_service.kv_cache import CACHE_STEP, TargetSession

log = logging.getLogger(__name__)

DEFAULT_WIDTHS = tuple(range(1, 10))     # block widths served: k + 1 for k = 0..8
DEFAULT_MAX_BATCH_ROWS = 32              # rows of all sessions' blocks in one verify forward
GGUF = "gguf"                            # gemm: the GGUF file's blocks (what the fast path always runs)


class TargetModel:
    def __init__(self, model, tokenizer, name: str, *, gemm: str = "auto", widths: Iterable[int] | None = None,
                 rowwise_attention: bool | None = None, max_block: int = 32, decoder: str = "auto",
                 fallback_reason: str = "", phases: dict[str, float] | None = None,
                 max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS):
        """Chooses and sets up the path that runs ``model`` (the arguments: ``Target``)."""
        from verifier_service.gguf_model import GgufModel, eos_token_ids

        if decoder not in ("auto", "static", "transformers"):
            raise ValueError(f"decoder must be 'auto', 'static' or 'transformers', not {decoder!r}")
        self.gguf = model if isinstance(model, GgufModel) else None
        self._model = None if self.gguf is not None else model
        self._tokenizer = tokenizer
        self.phases = dict(phases or {})
        self.gemm_choice: fast_linear.GemmChoice | None = None
        self.decoder: Decoder | None = None
        self.widths = tuple(sorted({int(w) for w in (widths or DEFAULT_WIDTHS)}))
        exact_rows = rowwise_attention is not False
        loading.enter("packing")
        if self.gguf is not None:
            if decoder == "transformers":
                raise ValueError("decoder='transformers' needs a transformers model (Target.load does it)")
            self.device = torch.device("cpu")
            self.decoder = self.gguf.decoder(exact_rows=exact_rows, gemm="auto" if gemm == GGUF else gemm,
                                             widths=self.widths)
            self.vocab_size = self.decoder.spec.vocab
            self.tokenizer_info = (self.gguf.tokenizer_info() if tokenizer is None else
                                   TokenizerInfo.of(tokenizer, eos_token_ids(self.gguf.file, tokenizer)))
            max_context = self.decoder.spec.context
            self.path = (f"GGUF fast path: {self.gguf.describe()}, ISA {getattr(self.decoder.ops, 'isa', 'torch')}, "
                         f"{self.decoder.spec.describe()}")
        else:
            self.device = model_device(model)
            config = model.config
            eos = config.eos_token_id if config.eos_token_id is not None else tokenizer.eos_token_id
            eos_ids = tuple(sorted({int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])
                                    if e is not None}))
            self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
            self.tokenizer_info = TokenizerInfo.of(tokenizer, eos_ids)
            max_context = int(getattr(config, "max_position_embeddings", 2048))
            if gemm == GGUF:
                raise ValueError("gemm='gguf' runs a GGUF file's blocks: load the target from its .gguf file")
            why_not = static_decoder.unsupported_reason(model)
            if decoder == "static" and why_not:
                raise ValueError(f"decoder='static' cannot run {name}: {why_not}; use decoder='transformers'")
            if decoder == "static" or (decoder == "auto" and not why_not and gemm != fast_linear.MKL):
                self.decoder = static_decoder.StaticDecoder(model, gemm=gemm, widths=self.widths, exact_rows=exact_rows)
            dtype = model.get_output_embeddings().weight.dtype
            self.path = (f"{'decoder' if self.decoder else 'transformers'} on {self.device.type} {str(dtype)[6:]}"
                         f" weights: {fallback_reason or why_not or 'a Hugging Face model'}")
        self.info = ModelInfo(model_name=name, vocab_size=self.vocab_size,
                              vocab_hash=self.tokenizer_info.vocab_hash, max_context=max_context,
                              eos_token_ids=self.tokenizer_info.eos_token_ids)
        self.max_block = int(max_block)
        exact_bound = self.decoder.max_exact_rows if self.decoder is not None and exact_rows else None
        if exact_bound is not None and self.max_block + 1 > exact_bound:
            raise ValueError(f"--max-block {self.max_block}: a block of more than {exact_bound - 1} drafts would "
                             f"not be computed as plain steps compute its rows; use --max-block {exact_bound - 1} "
                             "or less")
        if self.decoder is not None:
            d = self.decoder
            self.gemm, self.gemm_note, self.gemm_choice = d.gemm, d.gemm_note, d.gemm_choice
            self.attention = "static, rows exact" if d.exact_rows else "static, rows batched"
            log.info("%s", d.describe())
        else:
            self.gemm, self.gemm_note = self._setup_gemm(gemm)
            if decoder == "auto" and why_not and gemm != fast_linear.MKL:
                self.gemm_note += f"; transformers' forward ({why_not})"
            if rowwise_attention is None:
                rowwise_attention = self.gemm != fast_linear.MKL and (self.gemm_choice is None
                                                                       or self.gemm_choice.uniform)
            from verifier_service.forward import use_rowwise_attention

            self.attention = use_rowwise_attention(model, bool(rowwise_attention))
        self._cost_table: dict[int, float] = {}
        # One forward holds the blocks of many sessions where the decoder computes each row as it would alone
        # (within its exact-rows bound); otherwise (transformers' forward, a GEMM whose rows depend on the row
        # count) one session a forward.
        self.batching_note = "transformers' forward" if self.decoder is None else self.decoder.batching_note
        self.batched = not self.batching_note and int(max_batch_rows) > 1
        self.max_batch_rows = max(1, min(int(max_batch_rows), self.decoder.max_exact_rows if self.decoder else 1 << 30))

    @property
    def tokenizer(self):
        """The target's tokenizer (for a GGUF target loaded on first use: the verifier itself needs only
        ``tokenizer_info``)."""
        if self._tokenizer is None:
            self._tokenizer = self.gguf.tokenizer()
        return self._tokenizer

    @property
    def model(self):
        """The transformers model: the one served, or for a GGUF fast-path target the reference (transformers'
        own load of the same file, made on first use: a full fp32 copy, for checks, never for serving)."""
        if self._model is None:
            from tandem.models import load_causal_lm

            self._model = load_causal_lm(str(self.gguf.path))[0]
        return self._model

    def _setup_gemm(self, gemm: str) -> tuple[str, str]:
        """Installs the GEMM path on transformers' modules; returns (mode in use, why)."""
        if gemm not in fast_linear.GEMM_MODES:
            raise ValueError(f"gemm must be one of {fast_linear.GEMM_MODES}, not {gemm!r}")
        weight = self._model.get_output_embeddings().weight
        if gemm != fast_linear.MKL and (self.device.type != "cpu" or weight.dtype != torch.float32):
            return fast_linear.MKL, f"the fast path is for CPU fp32 ({self.device.type}, {weight.dtype})"
        mode, note, self.gemm_choice = fast_linear.configure(self._model, gemm, self.widths)
        return mode, note

    @classmethod
    def load(cls, spec: str | None = "default", *, dtype: str = "float32", device: str = "cpu", **kw) -> Self:
        """Loads, packs and warms the target on the torch thread (``torch_thread``), whoever calls; ``kw``: the
        constructor's keywords (``Target``'s)."""
        return torch_thread.run(cls._load_now, spec, dtype, device, kw)

    @classmethod
    def _load_now(cls, spec, dtype, device, kw) -> Self:
        """A GGUF file the decoder runs on this device and dtype: the fast path (the file's blocks, no fp32
        copy); anything else: transformers' load, with the reason on the start-up line."""
        from tandem.models import load_causal_lm, resolve, resolve_device
        from verifier_service.gguf_model import GgufModel

        loc = resolve(spec)
        reason = ""
        if loc.gguf_file:
            t0 = time.perf_counter()
            loading.enter("reading the file")
            gguf = GgufModel(loc.directory / loc.gguf_file)
            read_s = time.perf_counter() - t0
            device_name = resolve_device(device)
            if kw.get("decoder") == "transformers":
                reason = "decoder='transformers' asked for"
            elif device_name != "cpu" or dtype != "float32":
                reason = f"the GGUF fast path is for CPU float32 (asked: {device_name} {dtype})"
            elif gguf.unsupported:
                reason = f"{gguf.unsupported}, not on the GGUF fast path"
            if not reason:
                from verifier_service.activation_choice import settle

                gguf.activations_note = settle(gguf.file)     # before any weight loads
                print(f"[tandem] loading {loc.name} from {gguf.path} (GGUF fast path) ...", file=sys.stderr, flush=True)
                t0 = time.perf_counter()
                loading.enter("tokenizer")
                gguf.tokenizer_info()                     # converted once per file, then read from the cache
                phases = {"reading the file": read_s, "tokenizer": time.perf_counter() - t0}
                return cls(gguf, None, loc.name, phases=phases, **kw)
            if kw.get("decoder") == "static":
                raise ValueError(f"decoder='static' cannot run {loc.name}: {reason}")
            gguf.file.close()
        t0 = time.perf_counter()
        model, tokenizer, loc = load_causal_lm(spec, dtype=dtype, device=device)
        return cls(model, tokenizer, loc.name, fallback_reason=reason,
                   phases={"transformers load": time.perf_counter() - t0}, **kw)

    # ---- the model call ------------------------------------------------------------------------
    def cost_table(self) -> dict[int, float]:
        """{block width: ms of one target forward} (median, measured by ``warmup`` at start-up; {} if not run)."""
        return dict(self._cost_table)

    def warmup(self, widths: Iterable[int] | None = None, repeats: int = 3, context: int = 256) -> dict[int, float]:
        """Runs ``repeats`` forwards at each block width after a ``context``-token prefill (a scratch session,
        never stored), interleaving widths; returns and keeps {width: median ms} as the cost table. The context
        stays within a new cache's first allocation where it can: growing it copies the cache, the verifier's
        peak memory at start-up (20-35 MB)."""
        widths = sorted({int(w) for w in (widths or self.widths)})
        if not widths:
            return self.cost_table()
        if widths[-1] < CACHE_STEP // 2:
            context = min(int(context), CACHE_STEP - widths[-1])
        context = max(1, min(int(context), self.info.max_context - widths[-1] - 1))
        ids = self._probe_ids(context + widths[-1])
        session = self._scratch_session("__warmup__")
        self._forward(session, ids[:context], last_only=True)
        samples: dict[int, list[float]] = {w: [] for w in widths}
        for _ in range(max(1, repeats)):
            for w in widths:
                t0 = time.perf_counter()
                self._forward(session, ids[context:context + w])
                samples[w].append((time.perf_counter() - t0) * 1e3)
                session.rollback(context)
        table = {w: sorted(v)[len(v) // 2] for w, v in samples.items()}
        self._cost_table.update(table)
        return dict(table)

    def _probe_ids(self, n: int) -> list[int]:
        """``n`` fixed token ids for the forwards start-up times (no session's text)."""
        return [(7 * i + 3) % self.vocab_size for i in range(n)]

    def _scratch_session(self, name: str) -> TargetSession:
        """A session with an empty cache of its own, never stored, for the forwards start-up times."""
        return TargetSession(name, self._new_cache(), 0, -1, SamplingParams(), torch.Generator())

    def _new_cache(self):
        return torch_thread.run(self._new_cache_now)

    def _new_cache_now(self):
        if self.decoder is not None:
            return self.decoder.new_cache()
        from transformers import DynamicCache

        return DynamicCache(config=self._model.config)

    def _forward(self, session: TargetSession, input_ids: Sequence[int], last_only: bool = False) -> torch.Tensor:
        """Feeds input_ids after the cached tokens; returns logits [len(input_ids) or 1, V] (float32). On the
        torch thread (from elsewhere: queued there, between the scheduler's forwards)."""
        return torch_thread.run(self._forward_now, session, input_ids, last_only)

    @torch.inference_mode()
    def _forward_now(self, session: TargetSession, input_ids: Sequence[int], last_only: bool) -> torch.Tensor:
        if self.decoder is not None:         # a greedy session reads only each row's argmax (decoder.forward)
            return self.decoder.forward(session.cache, input_ids, last_only, session.sampling.greedy)   # [n or 1, V]
        ids = torch.tensor([list(input_ids)], dtype=torch.long, device=self.device)        # [1, n]
        out = self._model(input_ids=ids, cache=session.cache, use_cache=True, logits_to_keep=1 if last_only else 0)
        return out.logits[0].float()                                                     # [n, V]

    def _forward_blocks(self, blocks: list[tuple[TargetSession, list[int]]],
                        keep: list[int | None] | None = None) -> list[torch.Tensor]:
        """One forward over every session's block (its rows after its own cache); logits [n_i, V] each (``keep``:
        the decoder's, per block: only the last rows). Without the decoder (transformers' forward) the scheduler
        sends one block at a time."""
        if self.decoder is not None:         # argmax-only rows where every session is greedy (decoder.forward)
            return self.decoder.forward_blocks([(session.cache, ids) for session, ids in blocks], keep,
                                               all(session.sampling.greedy for session, _ in blocks))
        return [self._forward_now(session, ids, False) for session, ids in blocks]
