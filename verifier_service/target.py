"""The target's sessions: prefill a prompt, verify a draft block in ONE forward pass, roll back.

Public API (used by the servicer, by a gateway in the same process and by in-process tests):
  Target.load(spec, ...)                 load from 'default', a .gguf or a HF directory
  target.info                            tandem.types.ModelInfo (vocab hash, context, EOS ids)
  target.start(session_id, prompt_ids, sampling) -> (first_token, compute_ms)   (await target.astart(...))
  target.verify(session_id, draft)       -> tandem.types.VerifyOutcome          (await target.averify(...))
  target.end(session_id)                 -> bool (its K/V stay in the prefix cache for a later prompt that
                                                 begins with its tokens: ``verifier_service.prefix_cache``)
  target.cost_table()                    -> {block width: ms}, measured by warmup() at start-up
  target.warmup(widths)                  runs (and times) forwards at each block width

``Target`` is a ``verifier_service.target_model.TargetModel`` (which path runs the model and why, loading
it, the forward over a session's cache, warm-up and the cost table) with what its forwards are for: the
session store and the checks of each call, the scheduler's work (``run_verify``, ``run_prefill``), the
acceptance rule (``verifier_service.acceptance``) applied to each block, and the one place a session's
cache moves back to the accepted prefix (``run_verify``: ``TargetSession.rollback``). ``startup_line()``
says which path serves and why, how sessions share forwards, and how long each loading phase took.
Every forward runs on the torch thread, chosen by the scheduler (``verifier_service.scheduler``): the verify
blocks of all sessions waiting go into one forward, and prefill chunks (``prefill_chunk`` tokens each)
take turns with them by a fair share; a prefill stops at its next chunk once ``cancelled()`` (or its
caller is cancelled). ``start``/``verify`` queue the work and wait for it; ``astart``/``averify`` await it
without holding a thread.

A ``VerifyOutcome`` says where a round's time went: ``forward_ms``, the forward its block was part of
(shared with the sessions batched with it); ``compute_ms``, that forward and the block's acceptance rule
(what the gateway's cost model learns as the round's verify cost: it moves with how many rows share the
forward); ``queue_ms``, the wait for that forward (other forwards and prefill chunks ahead of it), which
the gateway counts with the round's overhead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterable, Sequence

import torch

from tandem import phases as loading, telemetry
from tandem.draft_checks import check_draft, check_ids
from tandem.memory import release_freed_memory
from tandem.sessions import SessionStore, check_session_id
from tandem.types import DraftToken, SamplingParams, VerifyOutcome
from verifier_service import torch_thread
from verifier_service.acceptance import accept_coupled, accept_greedy, accept_random, rejection_generator
from verifier_service.kv_cache import TargetSession
from verifier_service.prefix_cache import PrefixCache
from verifier_service.scheduler import PrefillWork, Scheduler, VerifyWork
from verifier_service.target_model import DEFAULT_MAX_BATCH_ROWS, TargetModel
from verifier_service.warping import warp

DEFAULT_PREFILL_CHUNK = 256
EXACT_PREFILL_CHUNK = 32       # prompt chunks on the row-exact kernels (``Target._default_prefill_chunk``)
EXACT_PREFILL_MAX_COST = 1.5   # row-exact prompt chunks where they cost at most this many times a wide chunk
PREFILL_PROBE_TOKENS = 128     # the prompt both ways are timed on at start-up
MAX_BATCH_SESSIONS = 64                  # sessions in one verify forward
MIX_ROWS = 16                  # a verify forward with a prompt's slice riding along: at most these rows in all
PREFIX_CACHE_MB = 256          # ended sessions' K/V kept for prompts that begin with their tokens


class PrefillCancelled(RuntimeError):
    """The request was cancelled while its prompt was being prefilled."""


def _is_cancelled(cancelled) -> bool:
    if cancelled is None:
        return False
    if hasattr(cancelled, "is_set"):
        return bool(cancelled.is_set())
    return bool(cancelled())


class Target(TargetModel):
    def __init__(self, model, tokenizer, name: str, *, session_ttl_s: float = 600.0, max_sessions: int = 256,
                 gemm: str = "auto", widths: Iterable[int] | None = None, warmup: bool = True,
                 prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK, rowwise_attention: bool | None = None,
                 max_block: int = 32, decoder: str = "auto", fallback_reason: str = "",
                 phases: dict[str, float] | None = None, max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS,
                 batch_wait_ms: float = -1.0, ahead_rows: bool = False, mix_rows: int = -1,
                 prefix_cache_mb: float = PREFIX_CACHE_MB, greedy_head: str = "auto"):
        """``model``: a ``gguf_model.GgufModel`` (the GGUF fast path: the decoder on the file's blocks) or a
        transformers model. ``gemm`` (fp32 weights only): "auto" (measure MKL and oneDNN per width at
        start-up, keep the faster), "onednn", or "mkl" (plain transformers); "gguf" is accepted for a GGUF
        target (its blocks are always what runs). ``widths``: the block widths to measure and warm (default
        1..9). ``warmup``: run and time forwards at each width now (fills ``cost_table()``).
        ``prefill_chunk``: tokens per prefill forward (None/0: the whole prompt at once).
        ``rowwise_attention``: small blocks attend row by row like plain steps (default: on when every width
        uses oneDNN). ``max_block``: the longest draft block any session may send (a session may set a
        shorter one at start). ``decoder``: "static" (``decoder``: an error if it cannot run the model),
        "transformers" (the model's own forward), or "auto" (static where it can run and ``gemm`` is not
        "mkl"). ``fallback_reason``: why a GGUF file is served by transformers (the start-up line says it).
        ``phases``: loading phases already timed ({name: s}; ``load`` passes reading and the tokenizer).
        ``max_batch_rows``: the most rows (all sessions' blocks together) one verify forward takes;
        ``batch_wait_ms``: how long a verify forward may wait for sessions of the previous one to come back
        (< 0: a quarter of the last verify forward's time; ``verifier_service.scheduler``). ``ahead_rows``:
        compute each session's pending row while its next block is on the way (``verifier_service.scheduler``;
        only with exact rows). ``mix_rows``: while sessions decode, a prompt is prefilled in slices riding along
        in their verify forwards, up to this many rows a forward (0: in chunks of its own; < 0: MIX_ROWS where
        a prompt's rows are computed the same in any forward, see ``mixes_prefill``). ``prefix_cache_mb``: the
        K/V of ended sessions kept, up to this many MiB, for prompts that begin with their tokens
        (``verifier_service.prefix_cache``; only where ``caches_prefixes``; 0: off). ``greedy_head``: greedy
        sessions' rows from the head's bound pass (``verifier_service.greedy_head``) at the widths where it
        measured faster at start ('auto', with ``warmup``), at every width ('on') or never ('off')."""
        if greedy_head not in ("auto", "on", "off"):
            raise ValueError(f"--greedy-head is 'auto', 'on' or 'off', not {greedy_head!r}")
        t_setup = time.perf_counter()
        self._ahead_rows = bool(ahead_rows)
        super().__init__(model, tokenizer, name, gemm=gemm, widths=widths, rowwise_attention=rowwise_attention,
                         max_block=max_block, decoder=decoder, fallback_reason=fallback_reason, phases=phases,
                         max_batch_rows=max_batch_rows)
        self.sessions: SessionStore[TargetSession] = SessionStore(session_ttl_s, max_sessions=max_sessions,
                                                                 what="verifier session",
                                                                 size_of=TargetSession.kv_bytes)
        self.prefill_note = ""
        t_probe = time.perf_counter()
        self.prefill_chunk = self._default_prefill_chunk(measure=warmup) \
            if prefill_chunk is not None and prefill_chunk < 0 else int(prefill_chunk or 0)
        probe_s = time.perf_counter() - t_probe if self.prefill_note else 0.0
        # Forwards and the acceptance rule run on the one torch thread (verifier_service.torch_thread: why),
        # one forward at a time, chosen by the scheduler.
        mix_rows = (MIX_ROWS if mix_rows < 0 else int(mix_rows)) if self.mixes_prefill else 0
        self.scheduler = Scheduler(self, prefill_chunk=self.prefill_chunk, max_batch_rows=self.max_batch_rows,
                                   max_batch_sessions=MAX_BATCH_SESSIONS if self.batched else 1,
                                   batch_wait_ms=batch_wait_ms, mix_rows=mix_rows)
        self.prefix_cache = (PrefixCache(int(prefix_cache_mb * 2 ** 20))
                             if prefix_cache_mb > 0 and self.caches_prefixes else None)
        self.setup_s = time.perf_counter() - t_setup - probe_s     # packing + GEMM measurement (+ merging weights)
        self.phases["packing"] = self.setup_s
        if probe_s:
            self.phases["timing prompt chunks"] = probe_s
        if self.decoder is not None and greedy_head != "auto":
            self.decoder.use_greedy_head(greedy_head == "on")
        t_warm = time.perf_counter()
        if warmup:
            loading.enter("measuring widths")
            if self.decoder is not None and greedy_head == "auto":    # before the cost table: greedy rounds
                torch_thread.run(self.decoder.measure_greedy_head)        # take the faster head
            self.warmup()
        self.warmup_s = time.perf_counter() - t_warm
        if warmup:
            self.phases["measuring widths"] = self.warmup_s
        release_freed_memory()

    def _default_prefill_chunk(self, measure: bool = True) -> int:
        """``prefill_chunk`` -1: EXACT_PREFILL_CHUNK tokens where every layer's linear runs int8 on an x8 copy
        (those kernels cost the same a row at any width, and a chunk is the longest stall a prefill puts on the
        sessions decoding beside it). Elsewhere, with exact rows, both ways are timed now (``measure``): chunks
        of EXACT_PREFILL_CHUNK rows run the row-exact kernels of a verify block, so a prompt's K/V are those its
        tokens get in any forward (prompts then ride along in verify forwards and ended sessions' K/V serve
        later prompts: ``mixes_prefill``, ``caches_prefixes``); chunks of DEFAULT_PREFILL_CHUNK run torch's
        GEMM, faster the wider, with rows that depend on the chunk. The exact ones are kept where they cost at
        most EXACT_PREFILL_MAX_COST times as much a token (0.7x on AVX-512, 1.43x on AVX2, 3.3x on the portable
        path: BENCHMARKS.md). Otherwise (no measuring, transformers' forward) DEFAULT_PREFILL_CHUNK. The head
        does not count: a prefill runs it on its last row only."""
        from verifier_service.decoder import ROW_BY_ROW_MAX
        from verifier_service.weights import BlockWeight

        w = self.decoder.weights if self.decoder is not None else None
        linears = [x for x in w.linears() if x is not w.head] if w is not None else []
        parts = [p for x in linears for p in (getattr(x, "parts", None) or [x])]
        if bool(parts) and all(isinstance(p, BlockWeight) and p.blocks.x8 is not None for p in parts):
            return EXACT_PREFILL_CHUNK
        tokens = min(PREFILL_PROBE_TOKENS, self.info.max_context - 1)
        if not measure or self.decoder is None or not self.decoder.rows_independent or tokens <= ROW_BY_ROW_MAX:
            return DEFAULT_PREFILL_CHUNK
        loading.enter("timing prompt chunks")
        exact, wide = self._prefill_ms(tokens, EXACT_PREFILL_CHUNK), self._prefill_ms(tokens, tokens)
        chosen = EXACT_PREFILL_CHUNK if exact <= EXACT_PREFILL_MAX_COST * wide else DEFAULT_PREFILL_CHUNK
        self.prefill_note = (f"{EXACT_PREFILL_CHUNK}-row exact chunks measured at {exact / wide:.2f}x a "
                             f"{tokens}-row chunk's cost")
        return chosen

    def _prefill_ms(self, tokens: int, chunk: int, runs: int = 2) -> float:
        """The least wall ms of ``runs`` prefills of ``tokens`` tokens in chunks of ``chunk`` (a scratch cache;
        the first run also warms the path)."""
        ids = self._probe_ids(tokens)
        best = float("inf")
        for _ in range(runs):
            session = self._scratch_session("__prefill_probe__")
            t0 = time.perf_counter()
            for i in range(0, tokens, chunk):
                self._forward(session, ids[i:i + chunk], last_only=True)
            best = min(best, (time.perf_counter() - t0) * 1e3)
        return best

    def startup_line(self) -> str:
        """What runs the target and why, and how long each loading phase took."""
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in self.phases.items())
        batching = (f"sessions batched, up to {self.max_batch_rows} rows a forward"
                    if self.scheduler.max_batch_sessions > 1 else
                    f"one session a forward ({self.batching_note or 'max batch rows 1'})")
        prefill = f"prefill chunks of {self.prefill_chunk} tokens" if self.prefill_chunk else "prompts prefilled whole"
        if self.prefill_note:
            prefill += f" ({self.prefill_note})"
        if self.scheduler.mix_rows:
            prefill += f" or slices in verify forwards of up to {self.scheduler.mix_rows} rows"
        if self.prefix_cache is not None:
            prefix = f"prefix cache of {self.prefix_cache.max_bytes / 2 ** 20:.0f} MiB"
        else:
            prefix = "no prefix cache" + (" (--prefix-cache-mb 0)" if self.caches_prefixes else
                                          f" (prompt chunks of {self.prefill_chunk or 'all'} rows do not run the "
                                          "row-exact kernels of a verify block)")
        head = f", greedy head {self.decoder.greedy_note}" if self.decoder is not None else ""
        return (f"{self.path}; GEMMs {self.gemm} ({self.gemm_note}){head}, attention {self.attention}, {batching}, "
                f"{prefill}, {prefix} ({phases})")

    # ---- the acceptance rule (on the torch thread) ------------------------------------------------
    def _choose(self, session: TargetSession, logits: torch.Tensor, draft: Sequence[DraftToken]):
        """Applies the acceptance rule to logits [k+1, V] for a block of k draft tokens (on the torch thread)."""
        return torch_thread.run(self._choose_now, session, logits, draft)

    def _choose_now(self, session: TargetSession, logits: torch.Tensor, draft: Sequence[DraftToken]):
        draft_ids = [t.token_id for t in draft]
        if session.sampling.greedy:
            return accept_greedy(logits, draft_ids)
        if session.sampling.coupled:
            # Row 0 predicts the token after the sequence so far: the cached tokens and the pending one
            # (none yet at the prefill, where pending_token is still -1).
            first_position = session.length + (1 if session.pending_token >= 0 else 0)
            return accept_coupled(logits, draft_ids, session.sampling, first_position)
        target_probs = warp(logits, session.sampling)                                      # [k+1, V]
        draft_probs = torch.zeros(len(draft), target_probs.shape[-1])                     # [k, V] q, dense
        for i, tok in enumerate(draft):
            draft_probs[i, list(tok.support_ids)] = torch.tensor(tok.support_probs, dtype=torch.float32)
        return accept_random(target_probs, draft_ids, draft_probs, session.generator)
    # ---- what the scheduler runs (on the torch thread) -------------------------------------------
    def wants_ahead(self, session: TargetSession) -> bool:
        """The pending row may be computed ahead (scheduler docstring) where rows are exact (a block's first
        row is then bit-identical to the same row computed ahead), once per round, within the context."""
        return (self.ahead_rows and session.ahead is None and not session.ahead_failed and session.in_flight == 0
                and session.pending_token >= 0 and session.cache is not None
                and session.length + 1 < self.info.max_context)

    @property
    def mixes_prefill(self) -> bool:
        """Whether a prompt's rows may ride along in verify forwards: the static decoder with exact,
        width-independent rows and prefill chunks narrow enough to run on the same row-exact kernels as a
        verify block (the int8 x8 path), so a prompt's K/V do not depend on how it was sliced."""
        from verifier_service.decoder import ROW_BY_ROW_MAX

        return (self.decoder is not None and self.decoder.rows_independent and self.batched
                and 0 < self.prefill_chunk <= ROW_BY_ROW_MAX)

    @property
    def caches_prefixes(self) -> bool:
        """Whether ended sessions' K/V may serve later prompts (``verifier_service.prefix_cache``): where a token's
        rows are the same bits in a prompt chunk, a plain step and a verify block (the static decoder with
        width-independent rows and prompt chunks on the same row-exact kernels: the int8 x8 path)."""
        from verifier_service.decoder import ROW_BY_ROW_MAX

        return (self.decoder is not None and self.decoder.rows_independent
                and 0 < self.prefill_chunk <= ROW_BY_ROW_MAX)

    @property
    def ahead_rows(self) -> bool:
        """Whether pending rows are computed ahead: the static decoder with exact, width-independent rows."""
        return self.decoder is not None and self.decoder.rows_independent and self._ahead_rows

    @torch.inference_mode()
    def run_verify(self, batch: list[VerifyWork], ahead: Sequence[TargetSession] = (),
                   mixed: tuple[PrefillWork, int] | None = None) -> None:
        """One forward over the blocks of ``batch`` (each session's [pending, x_1..x_k] after its own cache, the
        pending row left out where it was computed ahead), the pending rows of the ``ahead`` sessions and, with
        ``mixed`` = (work, n), the next n rows of that prompt (``run_prefill``'s work, the head on its last row
        only once the prompt is done); then each block's acceptance rule and rollback; completes each item's
        future (cancelled ones are skipped)."""
        slice_ = self._prefill_slice(*mixed) if mixed is not None else None
        ready = []
        for work in batch:
            session, k = work.session, len(work.draft)
            if work.future.cancelled():
                continue
            if session.length + k + 1 > self.info.max_context:
                _settle(work.future, error=ValueError(
                    f"session {session.session_id!r} would exceed the target's context of "
                    f"{self.info.max_context} tokens"))
                continue
            work.base = session.length
            ready.append((work, work.base))
        verified = {id(w.session) for w, _ in ready}
        ahead = [s for s in ahead if self.wants_ahead(s) and id(s) not in verified]
        if not ready and not ahead and slice_ is None:
            return
        t0 = time.perf_counter()
        blocks = [(w.session, ([] if w.session.ahead is not None else [w.session.pending_token])
                   + [t.token_id for t in w.draft]) for w, _ in ready]
        blocks += [(session, [session.pending_token]) for session in ahead]
        try:
            fed = [(s, ids) for s, ids in blocks if ids]
            keep = None
            if slice_ is not None:                      # the prompt's rows last, logits only where it ends
                work, ids = slice_
                fed.append((work.session, ids))
                keep = [None] * (len(fed) - 1) + [1 if work.done + len(ids) >= len(work.prompt_ids) else 0]
            out = self._forward_blocks(fed, keep) if fed else []    # plain steps computed ahead: no forward
            if slice_ is not None:
                prompt_logits = out.pop()
            computed = iter(out)
            logits = [next(computed) if ids else None for _, ids in blocks]
        except BaseException as exc:
            for work, base in ready:
                work.session.rollback(base)             # the cache as it was
                _settle(work.future, error=exc)
            for session in ahead:
                session.rollback(session.length)
                session.ahead_failed = True
            if slice_ is not None:
                _settle(slice_[0].future, error=exc)
            return
        if slice_ is not None:
            self._prefilled(slice_[0], len(slice_[1]), prompt_logits)
        t1 = time.perf_counter()
        rows = sum(len(ids) for _, ids in blocks)
        for session, row in zip(ahead, logits[len(ready):]):
            session.ahead, session.in_flight = row, 1     # the pending row, not the session's length yet
        for (work, base), block_logits in zip(ready, logits):
            session = work.session
            if session.ahead is not None:                 # row 0, computed ahead, then the drafted rows
                block_logits = (session.ahead if block_logits is None
                                else torch.cat([session.ahead, block_logits]))
            keep = base                                   # on any failure: the cache as it was
            try:
                session.in_flight = len(work.draft) + 1   # the block's rows: not the session's length yet
                result = self._choose(session, block_logits, work.draft)
                keep = base + 1 + result.accepted         # pending + the accepted drafts
            except BaseException as exc:
                session.rollback(keep)
                _settle(work.future, error=exc)
                continue
            session.rollback(keep)                        # the one place the cache moves back
            session.tokens.append(session.pending_token)
            session.tokens.extend(t.token_id for t in work.draft[:result.accepted])
            session.pending_token, session.ahead_failed = result.next_token, False
            t2 = time.perf_counter()
            work.timing = (t0, t1, t2, rows, len(ready))
            _settle(work.future, VerifyOutcome(result.accepted, result.next_token, result.bonus,
                                               compute_ms=(t2 - t0) * 1e3,
                                               queue_ms=(t0 - work.submitted) * 1e3, forward_ms=(t1 - t0) * 1e3,
                                               forward_rows=rows))

    def _prefill_slice(self, work: PrefillWork, n: int) -> tuple[PrefillWork, list[int]] | None:
        """The next ``n`` prompt tokens of ``work`` to feed, its cache made on the first; None (its future
        settled) once it was cancelled."""
        if work.future.cancelled() or work.cancelled():
            _settle(work.future, error=PrefillCancelled(
                f"session {work.session.session_id!r}: cancelled during prefill ({work.done} of "
                f"{len(work.prompt_ids)} prompt tokens done)"))
            return None
        if work.session.cache is None:
            work.session.cache = self._new_cache_now()
            if work.prefix is not None:                 # the prompt's first ``done`` tokens, from the prefix cache
                work.session.cache.load_prefix(work.prefix.kv, work.done, len(work.prompt_ids) + 1)
                work.prefix = None
            elif hasattr(work.session.cache, "reserve"):
                # room for the whole prompt at once: grown chunk by chunk, the cache would be copied at each
                # doubling, old and new resident together (an 800-token prompt: two copies, 24 MB at once)
                work.session.cache.reserve(len(work.prompt_ids) + 1)
        return work, list(work.prompt_ids[work.done:work.done + n])

    def _prefilled(self, work: PrefillWork, n: int, logits: torch.Tensor) -> None:
        """``n`` more prompt tokens of ``work`` are in its cache; after the last one, the target's first token
        from ``logits`` (the last row) settles its future."""
        work.done += n
        work.chunks += 1
        if work.done >= len(work.prompt_ids):
            work.session.tokens = list(work.prompt_ids)
            try:
                work.session.pending_token = self._choose(work.session, logits, []).next_token
            except BaseException as exc:
                _settle(work.future, error=exc)
                return
            _settle(work.future, work.session.pending_token)

    @torch.inference_mode()
    def run_prefill(self, work: PrefillWork, chunk: int) -> None:
        """The next ``chunk`` tokens of ``work``'s prompt into its session's cache (made by the first chunk); after
        the last one the target's first token. Cancelled (its future, or ``work.cancelled()``): stops here."""
        try:
            slice_ = self._prefill_slice(work, chunk)
            if slice_ is None:
                return
            logits = self._forward(work.session, slice_[1], last_only=True)                    # [1, V]
            self._prefilled(work, len(slice_[1]), logits)
        except BaseException as exc:
            _settle(work.future, error=exc)

    # ---- the session lifecycle -----------------------------------------------------------------
    def _prefill_work(self, session_id: str, prompt_ids: Sequence[int], sampling: SamplingParams, owner: str,
                      max_draft_length: int, cancelled, cache_salt: str = "") -> PrefillWork:
        """The checks of ``start``, then the prefill item for the scheduler (not queued yet)."""
        check_session_id(session_id, owner)
        self.sessions.check_free(session_id)     # before the prefill, not after it
        sampling.validate()
        check_ids(prompt_ids, self.vocab_size, "prompt")
        if not prompt_ids:
            raise ValueError("the prompt is empty: give at least one token")
        if len(prompt_ids) >= self.info.max_context:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens; the target's context is "
                             f"{self.info.max_context} (prompt + generated tokens must fit)")
        if not 0 <= max_draft_length <= self.max_block:
            raise ValueError(f"max_draft_length must be between 0 (the verifier's limit) and {self.max_block}, "
                             f"got {max_draft_length}")
        generator = None if sampling.greedy or sampling.coupled else rejection_generator()
        session = TargetSession(session_id, None, 0, -1, sampling, generator,
                                max_block=max_draft_length or self.max_block)
        session.cache_salt = str(cache_salt or "")
        work = PrefillWork(session, prompt_ids=list(prompt_ids), cancelled=lambda: _is_cancelled(cancelled))
        hit = self.prefix_cache.match(work.prompt_ids, session.cache_salt) if self.prefix_cache is not None else None
        if hit is not None:                             # copied into its cache with its first slice
            work.prefix, work.done, work.reused = hit, hit.length, hit.length
        return work

    def _started(self, work: PrefillWork, owner: str, t0: float) -> tuple[int, float]:
        """Stores the prefilled session (in the caller's context: the session store counts sessions per caller)
        and records the prefill's span."""
        ms = (time.perf_counter() - t0) * 1e3
        _record_span("target.forward", work.submitted_ns, work.wall_ns(time.perf_counter()),
                     {"tandem.tokens": len(work.prompt_ids), "tandem.prefill": True, "tandem.chunks": work.chunks,
                      "tandem.cached_tokens": work.reused,
                      "tandem.queue_ms": ((work.started or work.submitted) - work.submitted) * 1e3})
        self.sessions.add(work.session.session_id, work.session, owner)
        return work.session.pending_token, ms

    def start(self, session_id: str, prompt_ids: Sequence[int], sampling: SamplingParams, *, owner: str = "",
              max_draft_length: int = 0, cancelled: Callable[[], bool] | threading.Event | None = None,
              cache_salt: str = "") -> tuple[int, float]:
        """Prefills the prompt (in chunks of ``prefill_chunk`` tokens, other sessions' forwards may run in
        between); returns the first generated token (the target's own) and its wall ms. ``owner``: the
        session's secret, required by verify and end. ``max_draft_length``: the longest block this session
        will send (0: the node's ``max_block``). ``cancelled`` (a callable or an Event) is checked before
        each chunk: once true, PrefillCancelled is raised and no session is kept. ``cache_salt``: the prefix
        cache's scope (``verifier_service.prefix_cache``): it takes and leaves prefixes among sessions of the
        same salt only."""
        t0 = time.perf_counter()
        work = self._prefill_work(session_id, prompt_ids, sampling, owner, max_draft_length, cancelled, cache_salt)
        self.scheduler.submit(work).result()
        return self._started(work, owner, t0)

    async def astart(self, session_id: str, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                     owner: str = "", max_draft_length: int = 0,
                     cancelled: Callable[[], bool] | threading.Event | None = None,
                     cache_salt: str = "") -> tuple[int, float]:
        """``start`` for asyncio callers. Cancelling the awaiting task stops the prefill at its next chunk and
        keeps no session."""
        t0 = time.perf_counter()
        work = self._prefill_work(session_id, prompt_ids, sampling, owner, max_draft_length, cancelled, cache_salt)
        await asyncio.wrap_future(self.scheduler.submit(work))      # cancelled with the caller
        return self._started(work, owner, t0)

    def _verify_work(self, session_id: str, draft: Sequence[DraftToken], owner: str | None) -> VerifyWork:
        session = self.sessions.require(session_id, owner)
        check_draft(draft, self.vocab_size, session.sampling.needs_draft_probs, session.max_block)
        return VerifyWork(session, draft=tuple(draft))

    def _verified(self, work: VerifyWork, outcome: VerifyOutcome) -> VerifyOutcome:
        """Records the round's spans (the forward it was part of, its acceptance) in the caller's context."""
        t0, t1, t2, rows, sessions = work.timing
        _record_span("target.forward", work.submitted_ns, work.wall_ns(t1),
                     {"tandem.tokens": len(work.draft) + 1, "tandem.cached_tokens": work.base, "tandem.queue_ms": outcome.queue_ms, "tandem.forward_ms": outcome.forward_ms,
                      "tandem.batch.rows": rows, "tandem.batch.sessions": sessions})
        _record_span("acceptance", work.wall_ns(t1), work.wall_ns(t2),
                     {"tandem.k": len(work.draft), "tandem.greedy": work.session.sampling.greedy,
                      "tandem.accepted": outcome.accepted})
        return outcome

    def verify(self, session_id: str, draft: Sequence[DraftToken], owner: str | None = None) -> VerifyOutcome:
        """One target forward over [pending, x_1..x_k] (with whatever other sessions' blocks are waiting); keeps
        the accepted prefix, rolls back the rest. ``owner``: the session's secret (None: not checked, for
        in-process callers)."""
        work = self._verify_work(session_id, draft, owner)
        return self._verified(work, self.scheduler.submit(work).result())

    async def averify(self, session_id: str, draft: Sequence[DraftToken], owner: str | None = None) -> VerifyOutcome:
        """``verify`` for asyncio callers (cancelled before its forward: the block is never run)."""
        work = self._verify_work(session_id, draft, owner)
        return self._verified(work, await asyncio.wrap_future(self.scheduler.submit(work)))

    def end(self, session_id: str, owner: str | None = None) -> bool:
        """Frees the session (False if unknown); NotSessionOwner for a wrong ``owner`` (None: not checked). Its
        K/V go to the prefix cache, where there is one, for a later prompt that begins with its tokens."""
        session = self.sessions.pop(session_id, owner)
        if session is not None:
            self.scheduler.forget(session)
            tokens = list(session.tokens)
            if self.prefix_cache is not None and tokens and session.cache is not None:
                self.prefix_cache.put(tokens, session.cache.kv, session.cache_salt)
        return session is not None


def _settle(future: concurrent.futures.Future, result=None, error: BaseException | None = None) -> None:
    """Completes ``future`` unless its caller cancelled it meanwhile."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass


def _record_span(name: str, start_ns: int, end_ns: int, attributes: dict) -> None:
    """A span of the caller's trace for work the torch thread did on its behalf (times recorded there)."""
    tracer = telemetry.tracer()
    if tracer is not None:
        tracer.start_span(name, attributes=attributes, start_time=start_ns).end(end_time=end_ns)
