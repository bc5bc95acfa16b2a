"""The proposal step's DraftAhead traffic in a plain streak (gateway/proposal.py ``Proposer.advance``): the
drafter is told it has nothing to draft once, then the new text every FOLLOW_EVERY tokens instead of every
round; the next block it is asked for is drafted from the whole real sequence."""

import asyncio

from gateway.proposal import FOLLOW_EVERY, Proposer
from tandem.types import DraftToken, SamplingParams


class RecordingStream:
    """An AheadPort that records (sequence length, ahead) of each message and drafts ``ahead`` tokens
    continuing the last sequence it was told (token ids 1000 + position)."""

    def __init__(self):
        self.messages: list[tuple[int, int]] = []
        self.told: list[int] = []

    async def sync(self, sequence, ahead):
        self.messages.append((len(sequence), ahead))
        self.told = list(sequence)

    def usable(self, sequence):
        if self.messages and self.messages[-1][1] and list(sequence) == self.told:
            return [DraftToken(1000 + len(sequence) + i) for i in range(self.messages[-1][1])]
        return []

    async def wait(self, sequence, n, timeout_s):
        return self.usable(sequence)[:n]

    async def close(self):
        pass


class AheadDrafter:
    def __init__(self):
        self.stream = RecordingStream()

    def open_ahead(self, session_id, token, sampling):
        return self.stream


def test_a_plain_streak_sends_the_text_in_batches_and_a_block_sees_all_of_it():
    drafter = AheadDrafter()
    proposer = Proposer("s", "t", SamplingParams(), drafter)
    sequence = list(range(10))

    async def run():
        await proposer.start(sequence, 2)
        step = await proposer.propose(sequence, 2)
        assert step.source == "ahead" and [t.token_id for t in step.proposal.tokens] == [1010, 1011]
        sent = len(drafter.stream.messages)
        for _ in range(3 * FOLLOW_EVERY):                   # plain rounds, one token each
            sequence.append(7)
            await proposer.advance(sequence, 0)
        plain = drafter.stream.messages[sent:]
        assert plain[0] == (11, 0)                          # told once: nothing to draft
        assert [n for n, _ in plain[1:]] == [11 + FOLLOW_EVERY * i for i in (1, 2)]  # then in batches
        assert all(ahead == 0 for _, ahead in plain)
        step = await proposer.propose(sequence, 3)          # a block: the drafter is told all the text first
        assert drafter.stream.messages[-1] == (len(sequence), 7)
        assert [t.token_id for t in step.proposal.tokens] == [1000 + len(sequence) + i for i in range(3)]
        assert proposer.behind(sequence) == 0

    asyncio.run(run())


class GuessingStream:
    """An AheadPort over the gateway's real ``DraftedPath``: each sync asking for ``ahead`` tokens starts a new path
    drafted from the sequence it was told, each token the last one + 1 (the drafter's guess of what follows)."""

    def __init__(self):
        from gateway.ahead import DraftedPath

        self.path = DraftedPath()
        self.messages: list[tuple[int, int]] = []

    async def sync(self, sequence, ahead):
        self.messages.append((len(sequence), ahead))
        if ahead:
            guess = [sequence[-1] + 1 + i for i in range(ahead)]
            self.path.receive(len(self.messages), len(sequence), [DraftToken(t) for t in guess])

    def usable(self, sequence):
        return self.path.usable(sequence)

    async def wait(self, sequence, n, timeout_s):
        return self.usable(sequence)[:n]

    async def close(self):
        pass


def test_with_plain_ahead_a_plain_step_the_drafter_guessed_leaves_a_block_ready():
    drafter = AheadDrafter()
    drafter.stream = GuessingStream()
    proposer = Proposer("s", "t", SamplingParams(), drafter, plain_ahead=3)
    sequence = [5, 6, 7]

    async def run():
        await proposer.start(sequence, 2)
        assert drafter.stream.messages == [(3, 6)]          # the first block's depth (at least plain_ahead)
        ready = []
        for guessed in (True, False, False, True, True, False):     # plain steps: was the token the guess?
            sequence.append(sequence[-1] + (1 if guessed else 7))
            ready.append(len(proposer.ready(sequence)))
            await proposer.advance(sequence, 0)
            assert drafter.stream.messages[-1] == (len(sequence), 3)    # told every round, not every 32 tokens
        sequence.append(sequence[-1] + 1)
        return ready, await proposer.propose(sequence, 2)

    ready, step = asyncio.run(run())
    # after a plain step whose token was the drafter's guess, the tokens drafted after it are ready
    assert ready == [5, 0, 0, 2, 2, 0]
    assert step.source == "ahead" and step.wait_ms is None          # a block that costs no drafter time
    assert [t.token_id for t in step.proposal.tokens] == [sequence[-1] + 1, sequence[-1] + 2]


def test_a_model_free_node_is_followed_by_its_path_and_never_waited_for():
    """``follow_paths`` (a model-free node): the prompt is sent asking for the longest path; while the sequence
    runs along a path that still holds COPIER_REFILL tokens nothing is sent; a drafted round or a path left
    syncs at once; a plain streak without a path syncs every COPIER_FOLLOW_EVERY tokens."""
    from gateway.proposal import AHEAD_MAX, COPIER_FOLLOW_EVERY, COPIER_REFILL

    drafter = AheadDrafter()
    drafter.stream = GuessingStream()
    proposer = Proposer("s", "t", SamplingParams(), drafter, follow_paths=True)
    sequence = [5, 6, 7]
    messages = drafter.stream.messages

    async def run():
        await proposer.start(sequence, 2)
        assert messages == [(3, AHEAD_MAX)] and proposer.follows_paths
        for _ in range(AHEAD_MAX - COPIER_REFILL):          # plain steps along the path: nothing to say
            assert len(proposer.ready(sequence)) > COPIER_REFILL
            sequence.append(sequence[-1] + 1)
            await proposer.advance(sequence, 0)
        assert messages == [(3, AHEAD_MAX)]
        assert len(proposer.ready(sequence)) == COPIER_REFILL             # running short
        step = await proposer.propose(sequence, 4)
        assert step.source == "ahead" and step.wait_ms is None
        sequence.extend([t.token_id for t in step.proposal.tokens] + [sequence[-1] + 5])   # 4 kept, then
        await proposer.advance(sequence, 4)                 # the target's own token: a new path asked for at once
        assert messages[-1] == (len(sequence), AHEAD_MAX)
        drafter.stream.path.receive(99, len(sequence), [])  # the node has nothing for this context
        told = len(messages)
        for _ in range(3 * COPIER_FOLLOW_EVERY):
            proposer.ready(sequence)
            sequence.append(sequence[-1] + 7)               # new text: no path runs along it
            await proposer.advance(sequence, 0)
        return [n for n, _ in messages[told:]]

    synced = asyncio.run(run())
    assert len(synced) == 3 and all(b - a == COPIER_FOLLOW_EVERY for a, b in zip(synced, synced[1:]))


def test_a_followed_node_that_dies_costs_speed_only_and_the_round_says_why():
    """The stream of a followed node fails: ready() offers nothing, the next propose (whatever k) reports the
    fallback and leaves the request without the drafter; the rounds after are plain steps."""
    from gateway.ports import DrafterUnavailable

    class DyingStream(GuessingStream):
        def usable(self, sequence):
            if len(sequence) > 6:
                raise DrafterUnavailable("drafter 127.0.0.1:1: DraftAhead stream closed (UNAVAILABLE)")
            return super().usable(sequence)

    drafter = AheadDrafter()
    drafter.stream = DyingStream()
    proposer = Proposer("s", "t", SamplingParams(), drafter, follow_paths=True)
    sequence = [5, 6, 7]

    async def run():
        await proposer.start(sequence, 2)
        steps = []
        for _ in range(6):
            ready = proposer.ready(sequence)
            step = await proposer.propose(sequence, min(2, len(ready)))
            steps.append(step)
            sequence.extend([t.token_id for t in step.proposal.tokens] + [sequence[-1] + 1 + len(step.proposal.tokens)])
            await proposer.advance(sequence, len(step.proposal.tokens))
        return steps

    steps = asyncio.run(run())
    assert steps[0].source == "ahead" and not steps[0].fallback
    failed = [s for s in steps if s.fallback]
    assert len(failed) == 1 and "UNAVAILABLE" in failed[0].fallback and not failed[0].proposal.tokens
    assert proposer.drafter is None and all(not s.proposal.tokens for s in steps[steps.index(failed[0]):])
