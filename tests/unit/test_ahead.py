"""Drafting ahead, both ends without the network: the drafter's path (drafter_service.ahead.AheadPath) and the
gateway's copy of it (gateway.ahead.DraftedPath) agree on which tokens were drafted from the real context."""

from __future__ import annotations

import pytest

from drafter_service.ahead import CHUNK, AheadPath
from fake_drafters import RuleDrafter
from gateway.ahead import DraftedPath
from tandem.errors import InvalidInput
from tandem.types import DraftToken, SamplingParams


class NextDrafter(RuleDrafter):
    """Drafts ``(last * 7 + 3) % 97`` after ``last``: a deterministic continuation to check paths against."""

    kind = "next"

    def __init__(self, offer: bool = True):
        super().__init__(97)
        self.offer = offer
        self.contexts: list[list[int]] = []

    def draft_block(self, state, context, k, sampling, min_confidence=0.0, *, offset=0):
        self.contexts.append(list(context))
        if not self.offer:
            return []
        out, last = [], context[-1]
        for _ in range(k):
            last = (last * 7 + 3) % 97
            out.append(DraftToken(last))
        return out


def continuation(last: int, n: int) -> list[int]:
    out = []
    for _ in range(n):
        last = (last * 7 + 3) % 97
        out.append(last)
    return out


def drain(path: AheadPath, gateway: DraftedPath) -> None:
    """Drafts until the path holds ``ahead`` tokens, handing each chunk to the gateway's copy."""
    while path.wanted():
        chunk = path.draft()
        if chunk is not None:
            gateway.receive(chunk.path_id, chunk.position, chunk.tokens)


def ids(tokens) -> list[int]:
    return [t.token_id for t in tokens]


def started(seq: list[int], ahead: int):
    """A path synced to seq and drafted ``ahead`` tokens, with the gateway's copy: (drafter, path, gateway)."""
    drafter, gw = NextDrafter(), DraftedPath()
    path = AheadPath(drafter, "s", "tok", SamplingParams())
    path.sync(0, seq, ahead=ahead)
    drain(path, gw)
    return drafter, path, gw


def test_a_path_runs_ahead_and_is_kept_while_the_real_context_runs_along_it():
    seq = [4, 8, 15]
    drafter, path, gw = started(seq, ahead=5)
    assert ids(gw.usable(seq)) == continuation(15, 5)
    first_id = gw.path_id
    # the block's first 3 were accepted and the bonus is the path's 4th: all of it is the path's
    seq = seq + continuation(15, 4)
    assert ids(gw.usable(seq)) == continuation(15, 5)[4:]            # the path's rest, at once
    path.sync(3, seq[3:], ahead=5)
    drain(path, gw)
    assert gw.path_id == first_id                                     # the same path, drafted further
    assert ids(gw.usable(seq)) == continuation(seq[-1], 5)
    # the drafter drafted from the real context each time (its own path tokens included)
    assert all(c[:len(seq)] == seq[:len(c)] for c in drafter.contexts)


def test_a_path_the_context_leaves_is_void_and_a_new_one_is_drafted_from_the_real_context():
    seq = [4, 8, 15]
    drafter, path, gw = started(seq, ahead=4)
    old = gw.path_id
    wrong = (continuation(15, 1)[0] + 1) % 97
    seq = seq + [wrong]                                       # the target rejected the path's first token
    assert gw.usable(seq) == []
    path.sync(3, [wrong], ahead=4)
    # a chunk of the old path arriving late is ignored
    gw.receive(old, 7, (DraftToken(1),))
    assert gw.usable(seq) == []
    drain(path, gw)
    assert gw.path_id > old and ids(gw.usable(seq)) == continuation(wrong, 4)


def test_chunks_of_a_path_dropped_while_drafting_are_void():
    drafter, gw = NextDrafter(), DraftedPath()
    path = AheadPath(drafter, "s", "tok", SamplingParams())
    path.sync(0, [1, 2], ahead=3)
    # a sync arrives while the drafter drafts (simulated: between reading the state and storing the tokens)
    original = drafter.draft_block

    def racing(state, context, k, sampling, min_confidence=0.0, *, offset=0):
        path.sync(2, [50], ahead=3)
        return original(state, context, k, sampling, min_confidence, offset=offset)

    drafter.draft_block = racing
    assert path.draft() is None                               # drafted for a context that is no longer real
    drafter.draft_block = original
    drain(path, gw)
    assert ids(gw.usable([1, 2, 50])) == continuation(50, 3)


def test_a_drafter_with_nothing_to_offer_says_so_and_stops_until_told_more():
    drafter, gw = NextDrafter(offer=False), DraftedPath()
    path = AheadPath(drafter, "s", "tok", SamplingParams())
    path.sync(0, [1, 2, 3], ahead=4)
    chunk = path.draft()
    assert chunk is not None and chunk.tokens == ()
    gw.receive(chunk.path_id, chunk.position, chunk.tokens)
    assert gw.usable([1, 2, 3]) == [] and gw.exhausted([1, 2, 3])
    assert path.wanted() == 0                                 # no busy loop on an empty drafter
    path.sync(3, [9], ahead=4)
    assert path.wanted() == 4


def test_syncs_are_checked():
    path = AheadPath(NextDrafter(), "s", "tok", SamplingParams())
    with pytest.raises(InvalidInput, match="ahead"):
        path.sync(0, [1], ahead=1000)
    with pytest.raises(InvalidInput, match="empty context"):
        path.sync(0, [], ahead=1)
    path.sync(0, [1, 2], ahead=1)
    with pytest.raises(InvalidInput, match="position"):
        path.sync(5, [3], ahead=1)


def test_a_chunk_in_flight_when_the_context_runs_past_the_path_continues_it_where_it_agrees():
    """The gateway used the one token that had arrived and the target's bonus token came on top: the chunk being
    drafted meanwhile still holds the drafter's guess of that bonus, and its tokens past it continue the path."""
    drafter, gw = NextDrafter(), DraftedPath()
    path = AheadPath(drafter, "s", "tok", SamplingParams())
    seq = [4, 8, 15]
    path.sync(0, seq, ahead=6)
    chunk = path.draft()                                       # the first token alone, out at once
    gw.receive(chunk.path_id, chunk.position, chunk.tokens)
    first_id = gw.path_id
    guess = continuation(15, 2)
    original = drafter.draft_block

    def racing(state, context, k, sampling, min_confidence=0.0, *, offset=0):
        path.sync(3, guess, ahead=6)                            # the first token kept, the bonus as guessed
        return original(state, context, k, sampling, min_confidence, offset=offset)

    drafter.draft_block = racing
    chunk = path.draft()
    drafter.draft_block = original
    assert chunk is not None and chunk.path_id == first_id
    gw.receive(chunk.path_id, chunk.position, chunk.tokens)
    seq = seq + guess
    assert ids(gw.usable(seq)) == continuation(15, 1 + CHUNK)[2:]      # drafted from the real context
    drain(path, gw)
    assert gw.path_id == first_id and ids(gw.usable(seq)) == continuation(seq[-1], 6)


def test_a_chunk_in_flight_that_disagrees_with_the_tokens_past_the_path_is_void():
    drafter, gw = NextDrafter(), DraftedPath()
    path = AheadPath(drafter, "s", "tok", SamplingParams())
    seq = [4, 8, 15]
    path.sync(0, seq, ahead=6)
    chunk = path.draft()
    gw.receive(chunk.path_id, chunk.position, chunk.tokens)
    first, = continuation(15, 1)
    other = (continuation(first, 1)[0] + 1) % 97             # the target's bonus is not the drafter's guess
    original = drafter.draft_block

    def racing(state, context, k, sampling, min_confidence=0.0, *, offset=0):
        path.sync(3, [first, other], ahead=6)
        return original(state, context, k, sampling, min_confidence, offset=offset)

    drafter.draft_block = racing
    assert path.draft() is None
    drafter.draft_block = original
    seq = seq + [first, other]
    drain(path, gw)
    assert gw.path_id > chunk.path_id and ids(gw.usable(seq)) == continuation(other, 6)
