"""The pending row computed ahead (verifier_service.scheduler, Target.run_verify, --ahead-rows): while a
session's reply is on its way, the verifier computes the row its next block starts with. A plain step then
needs no forward, a draft block only its drafted rows, and what each session decodes is what it decodes
without it, token for token: greedy, with drafts accepted and rejected, several sessions at once, and
seeded sampling."""

from __future__ import annotations

import asyncio

import pytest

from tandem.types import DraftToken, SamplingParams
from tiny_models import make_tokenizer
from verifier_service import native
from verifier_service.cli import ahead_rows
from verifier_service.gguf_model import GgufModel
from verifier_service.target import Target

PROMPTS = [[3 + (7 * i + 5 * j) % 250 for j in range(4 + 3 * i)] for i in range(4)]


@pytest.fixture(autouse=True)
def kernels():
    if native.library() is None:
        pytest.skip(f"C kernels unavailable: {native.unavailable_reason()}")


def tiny_target(path, **kw):
    return Target(GgufModel(path), make_tokenizer(260), path.stem, widths=(1, 2), warmup=False, **kw)


def drafts(i, step, tokens):
    """Every third round a block of 3 drafts: the first two right where the chain repeats, else wrong."""
    if step % 3 != 2:
        return []
    return [(tokens[-1] + 1 + i + j) % 250 + 3 for j in range(3)]


def decode(target, prompts, steps, sampling=SamplingParams(), pause_s=0.003):
    """Every prompt at once (one asyncio task each), ``steps`` rounds; each round waits ``pause_s`` first (the
    gateway's turnaround: the time the verifier has to compute the pending row ahead). Returns each
    session's tokens and each round's (drafts, forward rows reported)."""
    rounds = []

    async def one(i, prompt):
        sid = f"s{i}"
        first, _ = await target.astart(sid, prompt, sampling)
        tokens = [first]
        for step in range(steps):
            await asyncio.sleep(pause_s)
            draft = drafts(i, step, tokens)
            out = await target.averify(sid, [DraftToken(t) for t in draft])
            tokens += draft[:out.accepted] + [out.next_token]
            rounds.append((len(draft), out.forward_rows))
        assert target.end(sid)
        return tokens

    async def all_of():
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return asyncio.run(all_of()), rounds


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_one_session_decodes_the_same_with_the_row_ahead(tiny_gguf_files, arch):
    path = tiny_gguf_files[arch]
    want, before = decode(tiny_target(path), PROMPTS[:1], 15)
    target = tiny_target(path, ahead_rows=True)
    assert target.ahead_rows
    got, after = decode(target, PROMPTS[:1], 15)
    assert got == want
    assert all(rows == k + 1 for k, rows in before)
    plain_after = [rows for k, rows in after[1:] if k == 0]
    assert plain_after and all(rows == 0 for rows in plain_after), after    # no forward: computed ahead
    assert any(rows == k for k, rows in after if k)                           # the drafted rows only


def test_several_sessions_and_seeded_sampling_decode_the_same(tiny_gguf_files):
    path = tiny_gguf_files["llama"]
    for sampling in (SamplingParams(), SamplingParams(temperature=0.8, seed=7)):
        want, _ = decode(tiny_target(path), PROMPTS, 12, sampling)
        got, rounds = decode(tiny_target(path, ahead_rows=True), PROMPTS, 12, sampling)
        assert got == want, sampling
        assert any(rows == 0 for k, rows in rounds if k == 0), rounds            # rows computed ahead were used


def test_the_row_ahead_is_dropped_with_a_failed_block(tiny_gguf_files, monkeypatch):
    """A forward that fails leaves the cache as it was before the row ahead; the next round recomputes it."""
    target = tiny_target(tiny_gguf_files["llama"], ahead_rows=True)
    want, _ = decode(tiny_target(tiny_gguf_files["llama"]), PROMPTS[:1], 6)
    real = target._forward_blocks
    calls = []

    def failing_once(blocks, keep=None):
        calls.append(len(blocks))
        if len(calls) == 3:
            raise RuntimeError("out of memory (test)")
        return real(blocks, keep)

    monkeypatch.setattr(target, "_forward_blocks", failing_once)

    async def run():
        first, _ = await target.astart("s", PROMPTS[0], SamplingParams())
        tokens, failed = [first], 0
        while len(tokens) < len(want[0]):
            await asyncio.sleep(0.003)
            try:
                out = await target.averify("s", [])
            except RuntimeError:
                failed += 1
                continue
            tokens.append(out.next_token)
        return tokens, failed
    tokens, failed = asyncio.run(run())
    assert tokens == want[0][:len(tokens)] and len(calls) > 3


def test_the_flag_is_on_where_a_cpu_is_free():
    assert ahead_rows("auto", 1, 2)[0] and not ahead_rows("auto", 2, 2)[0]
    assert "--ahead-rows on" in ahead_rows("auto", 2, 2)[1]
    assert ahead_rows("on", 4, 4) == (True, "on (--ahead-rows on)") and not ahead_rows("off", 1, 8)[0]
    with pytest.raises(ValueError, match="--ahead-rows is 'auto', 'on' or 'off'"):
        ahead_rows("sometimes", 1, 2)
