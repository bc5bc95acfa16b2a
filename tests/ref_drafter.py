"""A plain torch drafter with the OnnxDrafter API, for tests that exercise the rounds without ONNX.

It recomputes the whole context every step (no KV cache): slow, obviously correct.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from tandem.types import DraftToken, ModelInfo, Proposal, SamplingParams
from tandem.vocab import tokenizer_vocab_hash
from verifier_service.warping import warp


class UnknownSession(KeyError):
    pass


UnknownSession.__name__ = "UnknownSessionError"


class TorchDrafter:
    def __init__(self, model, tokenizer, name="ref-drafter", support_size=64):
        self.model, self.support_size = model.eval(), support_size
        self.info = ModelInfo(name, model.config.vocab_size, tokenizer_vocab_hash(tokenizer),
                              model.config.max_position_embeddings, (2,))
        self.contexts: dict[str, list[int]] = {}
        self.rngs: dict[str, np.random.Generator] = {}

    @torch.inference_mode()
    def propose(self, session_id, prefix_length, appended_tokens, k, sampling: SamplingParams) -> Proposal:
        t0 = time.perf_counter()
        if session_id not in self.contexts and prefix_length > 0:
            raise UnknownSession(session_id)
        context = self.contexts.get(session_id, [])[:prefix_length] + list(appended_tokens)
        self.contexts[session_id] = context
        rng = self.rngs.setdefault(session_id, np.random.default_rng(
            np.random.SeedSequence([sampling.seed or 0, 0xD7AF7])))
        seq, out = list(context), []
        for _ in range(k):
            logits = self.model(torch.tensor([seq])).logits[0, -1]
            if sampling.greedy:
                tok = DraftToken(int(torch.argmax(logits)))
            else:
                probs = warp(logits, sampling)
                top = torch.topk(probs, min(self.support_size, probs.numel()))
                ids, q = top.indices.numpy(), top.values.double().numpy()
                q = q / q.sum()
                i = rng.choice(len(ids), p=q)
                tok = DraftToken(int(ids[i]), tuple(int(x) for x in ids), tuple(float(x) for x in q.astype(np.float32)))
            out.append(tok)
            seq.append(tok.token_id)
        return Proposal(tuple(out), (time.perf_counter() - t0) * 1e3)

    def end_session(self, session_id) -> bool:
        self.rngs.pop(session_id, None)
        return self.contexts.pop(session_id, None) is not None
