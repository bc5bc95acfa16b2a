"""Plain greedy decoding through a verifier Target: the reference a speculative path must equal."""

from __future__ import annotations

from tandem.types import SamplingParams


def greedy_plain(target, prompt, n, sid):
    """n greedy tokens by plain decoding (empty drafts: one width-1 forward per token)."""
    first, _ = target.start(sid, prompt, SamplingParams())
    out = [first]
    while len(out) < n:
        out.append(target.verify(sid, []).next_token)
    target.end(sid)
    return out
