"""Drafting ahead over a real gRPC stream: the drafter keeps a path drafted beyond the real context and the
gateway uses exactly the tokens drafted from the real context."""

import asyncio
import time

import pytest

from harness import LoopThread
from tandem.types import SamplingParams


@pytest.fixture(scope="module")
def drafter_stack(tiny_drafter_onnx):
    from drafter_service.onnx_drafter import OnnxDrafter
    from drafter_service.server import start_drafter
    from gateway.clients import DrafterClient

    lt = LoopThread()
    drafter = OnnxDrafter(tiny_drafter_onnx, threads=1)
    service = lt.run(start_drafter(drafter))

    async def client():
        return DrafterClient(f"127.0.0.1:{service.port}")

    yield lt, drafter, lt.run(client())
    lt.run(service.stop(0))
    lt.close()


def greedy_block(drafter, context, k, name):
    """What the drafter proposes for ``context`` in a fresh session (the reference)."""
    ids = [t.token_id for t in drafter.propose(name, 0, context, k, SamplingParams()).tokens]
    drafter.end_session(name)
    return ids


PROMPT = [5, 9, 13, 2, 7, 30, 41, 9, 13]


async def open_stream(client, name, ahead):
    """A DraftAhead stream synced to PROMPT and its first ``ahead`` tokens: (stream, tokens)."""
    from gateway.clients import AheadStream

    stream = AheadStream(client, name, "secret", SamplingParams())
    await stream.sync(PROMPT, ahead=ahead)
    return stream, await stream.wait(PROMPT, ahead, timeout_s=10)


def test_the_path_is_the_drafters_own_continuation_and_survives_a_hit(drafter_stack):
    lt, drafter, client = drafter_stack

    async def run():
        stream, first = await open_stream(client, "ahead-1", 4)
        path_id = stream.path.path_id
        # the block was accepted and the target's next token is the path's: the rest of the path stays
        seq = PROMPT + [t.token_id for t in first[:3]]
        await stream.sync(seq, ahead=4)
        kept = stream.usable(seq)
        later = await stream.wait(seq, 4, timeout_s=10)
        await stream.close()
        return first, path_id, kept, later, stream.path.path_id

    first, path_id, kept, later, path_id_after = lt.run(run())
    ids = [t.token_id for t in first]
    assert ids[:4] == greedy_block(drafter, PROMPT, 4, "ref-1")
    assert [t.token_id for t in kept] == ids[3:4]            # usable at once, before the drafter hears the sync
    assert path_id_after == path_id                          # no new path: the drafter went on drafting it
    seq = PROMPT + ids[:3]
    assert [t.token_id for t in later][:4] == greedy_block(drafter, seq, 4, "ref-2")


def test_a_rejected_path_is_never_used_and_a_new_one_follows_the_real_context(drafter_stack):
    lt, drafter, client = drafter_stack

    async def run():
        stream, first = await open_stream(client, "ahead-2", 3)
        other = next(t for t in range(3, 60) if t != first[0].token_id)
        seq = PROMPT + [other]                              # the target rejected the first drafted token
        stale = stream.usable(seq)                          # the old path does not run along seq: nothing
        await stream.sync(seq, ahead=3)
        fresh = await stream.wait(seq, 3, timeout_s=10)
        await stream.close()
        return first, seq, stale, fresh

    first, seq, stale, fresh = lt.run(run())
    assert stale == []
    assert [t.token_id for t in fresh][:3] == greedy_block(drafter, seq, 3, "ref-3")


def test_the_stream_s_end_ends_the_drafter_session_and_bad_syncs_are_refused(drafter_stack):
    from gateway.clients import AheadStream
    from gateway.ports import DrafterUnavailable

    lt, drafter, client = drafter_stack

    async def run():
        stream, _ = await open_stream(client, "ahead-3", 2)
        during = drafter.session_count()
        await stream.close()
        for _ in range(100):
            if drafter.session_count() < during:
                break
            await asyncio.sleep(0.02)
        after = drafter.session_count()
        bad = AheadStream(client, "ahead-4", "secret", SamplingParams())
        await bad.sync(PROMPT, ahead=10_000)                   # more than the drafter keeps ahead
        with pytest.raises(DrafterUnavailable, match="INVALID_ARGUMENT"):
            await bad.wait(PROMPT, 1, timeout_s=10)
        await bad.close()
        return during, after

    during, after = lt.run(run())
    assert during >= 1 and after == during - 1


def test_a_suffix_drafter_learns_a_streamed_request_to_its_last_token_and_never_its_own_guesses():
    """Over DraftAhead, a model-free suffix drafter indexes the real text only (not the path it drafted ahead),
    and the stream's end gives it the request's last tokens, so the next request that repeats the text gets
    it proposed."""
    from drafter_service.server import start_drafter
    from drafter_service.suffix_drafter import SuffixDrafter
    from gateway.clients import AheadStream, DrafterClient

    lt = LoopThread()
    drafter = SuffixDrafter()
    service = lt.run(start_drafter(drafter))
    text = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]

    async def run():
        client = DrafterClient(f"127.0.0.1:{service.port}")
        first = AheadStream(client, "first", "secret", SamplingParams())
        await first.sync(text[:4], ahead=3)
        await first.wait(text[:4], 1, timeout_s=5)          # nothing to copy yet: an empty path, said at once
        await first.sync(text, ahead=0)                     # the request went on and ended
        await first.close()
        for _ in range(100):
            if drafter.session_count() == 0:
                break
            await asyncio.sleep(0.02)
        again = AheadStream(client, "again", "secret", SamplingParams())
        await again.sync(text[:4], ahead=5)
        got = await again.wait(text[:4], 5, timeout_s=5)    # a match of 4 tokens: 4 copies, said to be all
        await again.sync(text[:8], ahead=5)                 # the text went along them: the path goes on
        got += await again.wait(text[:8], 5, timeout_s=5)
        await again.close()
        return [t.token_id for t in got], [t.origin for t in got], [t.match_length for t in got]

    try:
        t0 = time.monotonic()
        ids, origins, matches = lt.run(run())
        took = time.monotonic() - t0
    finally:
        lt.run(service.stop(0))
        lt.close()
    assert ids == text[4:] and set(origins) == {"suffix"}
    assert matches == [4, 5, 6, 7, 8, 9, 10, 11]            # each copy: the tokens before it that agreed
    assert took < 4                                         # no wait ran to its timeout: the chunks said "last"
