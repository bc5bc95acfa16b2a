"""Lossless on the real default pair: greedy speculative output == plain decoding == HF generate.

6 Spec-Bench prompts from 6 categories, chat template, 64 new tokens, k = 4, through real gRPC
servers on loopback (verifier with SmolLM2-135M-Instruct, drafter on ONNX Runtime, gateway).
"""

import pytest
import torch

from spec_bench import spec_bench_prompts
from harness import Stack
from tandem.pb import gateway_pb2

pytestmark = pytest.mark.integration

CATEGORIES = ["writing", "reasoning", "coding", "translation", "qa", "math_reasoning"]


@pytest.fixture(scope="module")
def stack(default_target, default_drafter):
    s = Stack(default_target, default_drafter, draft_length=4)
    yield s
    s.close()


@pytest.mark.parametrize("qid, category, prompt", spec_bench_prompts(CATEGORIES))
def test_greedy_tokens_equal_plain_decoding_and_hf_generate(stack, qid, category, prompt):
    req = dict(prompt=prompt, chat=True, max_tokens=64, ignore_eos=True)
    spec = stack.gateway_stub.Generate(gateway_pb2.GenerateRequest(draft_length=4, **req), timeout=600)
    plain = stack.gateway_stub.Generate(gateway_pb2.GenerateRequest(no_speculation=True, **req), timeout=600)
    assert spec.stats.speculative and spec.stats.proposed > 0, spec.stats.fallback_reason
    assert len(spec.token_ids) == 64
    assert list(spec.token_ids) == list(plain.token_ids), f"question {qid} ({category}): speculative != plain"

    tok = stack.gateway.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    prompt_ids = tok(text, add_special_tokens=False)["input_ids"]
    assert spec.stats.prompt_tokens == len(prompt_ids)
    with torch.inference_mode():
        ids = torch.tensor([prompt_ids])
        # An explicit attention mask: the chat template contains <|im_end|>, which is also the pad id,
        # and generate() would otherwise mask it out of the prompt.
        hf = stack.target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64,
                                         do_sample=False, eos_token_id=None, pad_token_id=2)[0, len(prompt_ids):].tolist()
    assert list(spec.token_ids) == hf, f"question {qid} ({category}): speculative != HF generate"
