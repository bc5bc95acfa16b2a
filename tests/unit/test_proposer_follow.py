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
