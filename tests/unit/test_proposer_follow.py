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
