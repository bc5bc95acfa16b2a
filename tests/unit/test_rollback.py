"""KV-cache rollback: after a partial accept the verifier continues exactly like a fresh forward."""

import torch

from tandem.types import DraftToken, SamplingParams
from verifier_service.target import Target


def test_logits_after_partial_accept_match_fresh_forward(tiny_target_dir):
    target = Target.load(str(tiny_target_dir))
    prompt = [1, 5, 9, 14, 3]
    first, _ = target.start("s", prompt, SamplingParams())
    with torch.inference_mode():
        greedy_next = int(target.model(torch.tensor([prompt + [first]])).logits[0, -1].argmax())
    wrong = (greedy_next + 1) % 64
    # Draft: the right token, then a wrong one -> exactly one accepted, the cache must drop the rest.
    outcome = target.verify("s", [DraftToken(greedy_next), DraftToken(wrong), DraftToken(7)])
    assert outcome.accepted == 1 and not outcome.bonus
    session = target.sessions.get("s")
    accepted_seq = prompt + [first, greedy_next]
    assert session.length == len(accepted_seq) == session.cache.get_seq_length()

    # Next pass after rollback vs a fresh forward over the accepted sequence + the recovered token.
    probe = target._forward(session, [outcome.next_token, 11])
    with torch.inference_mode():
        fresh = target.model(torch.tensor([accepted_seq + [outcome.next_token, 11]])).logits[0, -2:]
    assert torch.max(torch.abs(probe - fresh)).item() <= 1e-4
