"""The gateway's copy of a drafter's path (``drafter_service.ahead``): tokens drafted beyond the real
sequence, received as the drafter streams them, and which of them a round may use.

A path's tokens are usable only where the path runs along what was really emitted: every path token at a
position the sequence already holds must equal the token emitted there. Then the path was drafted from the
real context, and its tokens past the sequence's end are proposals for the real context (the exactness
argument is in ``drafter_service.ahead``). The check is on the gateway's side, against the sequence it
holds, whatever the drafter believes.

No grpc here: ``gateway.clients.AheadStream`` feeds it.
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.types import DraftToken


class DraftedPath:
    """The newest path a drafter streamed: its id, the sequence position of its first held token, its tokens."""

    def __init__(self) -> None:
        self.path_id = 0                    # 0: none yet (the drafter numbers paths from 1)
        self.position = 0
        self.tokens: list[DraftToken] = []
        self.stalled = False                # the drafter has nothing more for this path (an empty chunk at its end)

    def receive(self, path_id: int, position: int, tokens: Sequence[DraftToken], last: bool = False) -> None:
        """Adds a chunk: a newer path replaces the held one; the held path's next chunk extends it (an empty one,
        or one marked ``last``, says the drafter offers nothing more for it until told more context); anything
        else (a chunk of a dropped path, a gap) is ignored."""
        if path_id > self.path_id:
            self.path_id, self.position, self.tokens = path_id, position, list(tokens)
        elif path_id == self.path_id and position == self.position + len(self.tokens):
            self.tokens.extend(tokens)
        else:
            return
        self.stalled = not tokens or last

    @property
    def end(self) -> int:
        """The position after the held path's last token."""
        return self.position + len(self.tokens)

    def usable(self, sequence: Sequence[int]) -> list[DraftToken]:
        """The path's tokens past ``sequence``, if the path runs along it; else []. Drops the tokens the
        sequence has passed (they were checked now; the sequence only grows)."""
        n = len(sequence)
        if not self.tokens or not self.position <= n < self.end:
            return []
        passed = n - self.position
        if any(t.token_id != s for t, s in zip(self.tokens[:passed], sequence[self.position:n])):
            self.tokens = []                # the sequence left this path: nothing of it can be used again
            self.stalled = False
            return []
        del self.tokens[:passed]
        self.position = n
        return list(self.tokens)

    def exhausted(self, sequence: Sequence[int]) -> bool:
        """Whether the drafter said it offers nothing beyond what is held, for a path that runs along
        ``sequence`` (call after ``usable``)."""
        return self.stalled and self.position <= len(sequence) <= self.end
