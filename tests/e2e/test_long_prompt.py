"""A long prompt keeps speculation on: the drafter prefills its context in chunks well within
its deadline, so the request speculates instead of silently falling back to target-only decoding.
Before, a 5 000-word prompt's first Propose (one ONNX run over the whole prompt) missed the 15 s drafter
deadline and the request decoded with the target alone."""

import pytest

from harness import Stack
from tandem.pb import gateway_pb2

pytestmark = pytest.mark.integration


def test_a_4000_token_prompt_still_speculates(default_target, default_drafter):
    stack = Stack(default_target, default_drafter, draft_length=4)
    try:
        words = ("The quick brown fox jumps over the lazy dog while the river runs past the old mill, "
                 "and the miller counts his sacks of flour one by one. ") * 160
        prompt = words + "\nSummarize the text above in one sentence."
        reply = stack.gateway_stub.Generate(gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=24,
                                                                        ignore_eos=True), timeout=600)
        assert reply.stats.prompt_tokens >= 4000, reply.stats.prompt_tokens
        assert reply.stats.speculative and not reply.stats.fallback_reason, reply.stats.fallback_reason
        assert reply.stats.proposed > 0 and len(reply.token_ids) == 24
    finally:
        stack.close()
