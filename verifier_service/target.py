"""The target model: prefill a prompt, verify a draft block in ONE forward pass, roll back.

Public API (used by the servicer and by in-process tests):
  Target.load(spec, ...)                 load from 'default', a .gguf or a HF directory
  target.info                            tandem.types.ModelInfo (vocab hash, context, EOS ids)
  target.start(session_id, prompt_ids, sampling) -> (first_token, compute_ms)
  target.verify(session_id, draft)       -> tandem.types.VerifyOutcome
  target.end(session_id)                 -> bool
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import torch

from tandem import telemetry
from tandem.models import model_device
from tandem.types import DraftToken, ModelInfo, SamplingParams, VerifyOutcome
from tandem.vocab import tokenizer_vocab_hash
from verifier_service.acceptance import accept_greedy, accept_random
from tandem.sessions import SessionStore
from verifier_service.kv_cache import TargetSession
from verifier_service.warping import warp


class Target:
    def __init__(self, model, tokenizer, name: str, *, session_ttl_s: float = 600.0, max_sessions: int = 256):
        self.model = model
        self.tokenizer = tokenizer
        self.device = model_device(model)
        config = model.config
        eos = config.eos_token_id if config.eos_token_id is not None else tokenizer.eos_token_id
        eos_ids = tuple(sorted({int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None}))
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.info = ModelInfo(model_name=name, vocab_size=self.vocab_size,
                              vocab_hash=tokenizer_vocab_hash(tokenizer),
                              max_context=int(getattr(config, "max_position_embeddings", 2048)),
                              eos_token_ids=eos_ids)
        self.sessions: SessionStore[TargetSession] = SessionStore(session_ttl_s, max_sessions=max_sessions,
                                                                 what="verifier session",
                                                                 size_of=TargetSession.kv_bytes)
        # One forward at a time: torch already uses every core for one sequence on CPU.
        self._forward_lock = threading.Lock()

    @classmethod
    def load(cls, spec: str | None = "default", *, dtype: str = "float32", device: str = "cpu", **kw) -> "Target":
        from tandem.models import load_causal_lm

        model, tokenizer, loc = load_causal_lm(spec, dtype=dtype, device=device)
        return cls(model, tokenizer, loc.name, **kw)

    # ---- the model call ------------------------------------------------------------------------
    @torch.inference_mode()
    def _forward(self, session: TargetSession, input_ids: Sequence[int], last_only: bool = False) -> torch.Tensor:
        """Feeds input_ids after the cached tokens; returns logits [len(input_ids) or 1, V] (float32)."""
        ids = torch.tensor([list(input_ids)], dtype=torch.long, device=self.device)        # [1, n]
        with self._forward_lock:
            out = self.model(input_ids=ids, cache=session.cache, use_cache=True,
                             logits_to_keep=1 if last_only else 0)
        return out.logits[0].float()                                                     # [n, V]

    def _choose(self, session: TargetSession, logits: torch.Tensor, draft: Sequence[DraftToken]):
        """Applies the acceptance rule to logits [k+1, V] for a block of k draft tokens."""
        draft_ids = [t.token_id for t in draft]
        if session.sampling.greedy:
            return accept_greedy(logits, draft_ids)
        target_probs = warp(logits, session.sampling)                                      # [k+1, V]
        draft_probs = torch.zeros(len(draft), target_probs.shape[-1])                     # [k, V] q, dense
        for i, tok in enumerate(draft):
            draft_probs[i, list(tok.support_ids)] = torch.tensor(tok.support_probs, dtype=torch.float32)
        return accept_random(target_probs, draft_ids, draft_probs, session.generator)

    # ---- the session lifecycle -----------------------------------------------------------------
    def start(self, session_id: str, prompt_ids: Sequence[int], sampling: SamplingParams) -> tuple[int, float]:
        """Prefills the prompt; returns the first generated token (the target's own) and compute ms."""
        t0 = time.perf_counter()
        if not session_id:
            raise ValueError("session_id must not be empty")
        sampling.validate()
        self._check_ids(prompt_ids, "prompt")
        if not prompt_ids:
            raise ValueError("the prompt is empty: give at least one token")
        if len(prompt_ids) >= self.info.max_context:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens; the target's context is "
                             f"{self.info.max_context} (prompt + generated tokens must fit)")
        from transformers import DynamicCache

        generator = torch.Generator()
        generator.manual_seed(sampling.seed if sampling.seed is not None else int(torch.seed()))
        session = TargetSession(session_id, DynamicCache(config=self.model.config), 0, -1, sampling, generator)
        with telemetry.span("target.forward", {"tandem.tokens": len(prompt_ids), "tandem.prefill": True}):
            logits = self._forward(session, prompt_ids, last_only=True)                    # [1, V]
        session.length = len(prompt_ids)
        session.pending_token = self._choose(session, logits, []).next_token
        self.sessions.add(session_id, session, replace=True)
        return session.pending_token, (time.perf_counter() - t0) * 1e3

    def verify(self, session_id: str, draft: Sequence[DraftToken]) -> VerifyOutcome:
        """One target forward over [pending, x_1..x_k]; keeps the accepted prefix, rolls back the rest."""
        t0 = time.perf_counter()
        session = self.sessions.require(session_id)
        self._check_draft(session, draft)
        with session.lock:
            k = len(draft)
            if session.length + k + 1 > self.info.max_context:
                raise ValueError(f"session {session_id!r} would exceed the target's context of "
                                 f"{self.info.max_context} tokens")
            with telemetry.span("target.forward", {"tandem.tokens": k + 1, "tandem.cached_tokens": session.length}):
                logits = self._forward(session, [session.pending_token] + [t.token_id for t in draft])  # [k+1, V]
            with telemetry.span("acceptance", {"tandem.k": k, "tandem.greedy": session.sampling.greedy}) as span:
                result = self._choose(session, logits, draft)
                span.set_attribute("tandem.accepted", result.accepted)
            # Cache now holds length + k + 1 tokens; keep pending + the accepted drafts.
            session.rollback(session.length + 1 + result.accepted)
            session.pending_token = result.next_token
        return VerifyOutcome(result.accepted, result.next_token, result.bonus, (time.perf_counter() - t0) * 1e3)

    def end(self, session_id: str) -> bool:
        return self.sessions.pop(session_id) is not None

    # ---- input checks --------------------------------------------------------------------------
    def _check_ids(self, ids: Sequence[int], what: str) -> None:
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"{what} has token ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}")

    def _check_draft(self, session: TargetSession, draft: Sequence[DraftToken]) -> None:
        self._check_ids([t.token_id for t in draft], "the draft block")
        for i, tok in enumerate(draft):
            if len(tok.support_ids) != len(tok.support_probs):
                raise ValueError(f"draft position {i}: {len(tok.support_ids)} support ids but "
                                 f"{len(tok.support_probs)} probabilities")
            if any(not 0.0 <= q <= 1.0 for q in tok.support_probs):
                raise ValueError(f"draft position {i}: probabilities must lie in [0, 1]")
            self._check_ids(tok.support_ids, f"draft position {i} support")
            if not session.sampling.greedy:
                if not tok.support_ids:
                    raise ValueError(f"draft position {i}: a sampled session needs the draft distribution q "
                                     "(support ids and probabilities) for exact verification")
                if tok.token_id not in tok.support_ids:
                    raise ValueError(f"draft position {i}: token {tok.token_id} is outside its own support")
