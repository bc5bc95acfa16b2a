"""What a finished round reports to the draft-length choice."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RoundFigures:
    """The figures of one finished round that the cost model and the acceptance estimator learn from.

    Independent of ``gateway.rounds``' layout: build it from the Proposal, the VerifyOutcome and the
    round's wall time (``from_outcome``).
    """

    width: int                          # draft tokens verified (the forward covered width + 1 positions)
    accepted: int                       # draft tokens kept (a prefix of the block)
    verify_ms: float                    # verifier's own compute (VerifyOutcome.compute_ms)
    round_ms: float                     # wall time of the round at the gateway
    draft_ms: float = 0.0               # drafter's own compute (Proposal.compute_ms)
    from_lookup: tuple[bool, ...] = ()  # per proposed token: copied by prompt lookup; () = none were
    drafter_called: bool | None = None  # a Propose call happened (None: width > 0)
    propose_wall_ms: float | None = None  # wall time of the Propose call at the gateway, if timed
    lookup_predicted: int = 0           # lookup tokens the gateway predicted at the block's head (its choice of k)
    lookup_ngram: int = 0               # the n-gram length that prediction was found by (0: none / unknown)
    catch_up: int = 0                   # context tokens the drafter had not seen before this call (read first)
    forward_rows: int = 0               # rows of the verifier's forward, other sessions' included (0: unknown)
    matches: tuple[int, ...] = ()       # per proposed token: a suffix copy's match length (0: none); () = no such

    def __post_init__(self):
        if self.from_lookup and len(self.from_lookup) != self.width:
            raise ValueError(f"from_lookup has {len(self.from_lookup)} flags for a block of {self.width}")
        if self.matches and len(self.matches) != self.width:
            raise ValueError(f"matches has {len(self.matches)} lengths for a block of {self.width}")
        if not 0 <= self.accepted <= self.width:
            raise ValueError(f"accepted {self.accepted} outside 0..{self.width}")

    @property
    def speculative(self) -> bool:
        """Whether the round called the drafter (a block the gateway copied itself did not)."""
        return self.width > 0 if self.drafter_called is None else bool(self.drafter_called)

    @property
    def other_rows(self) -> int:
        """Rows of other sessions' blocks in the forward that verified this block (0 when not reported)."""
        return max(0, self.forward_rows - (self.width + 1)) if self.forward_rows else 0

    @property
    def lookup_tokens(self) -> int:
        return sum(self.from_lookup)

    @property
    def model_tokens(self) -> int:
        return self.width - self.lookup_tokens

    @classmethod
    def from_outcome(cls, proposal, outcome, round_ms: float, propose_wall_ms: float | None = None,
                     drafter_called: bool | None = None) -> "RoundFigures":
        """From a ``tandem.types.Proposal`` and ``VerifyOutcome`` (duck-typed). The lookup prediction
        (``lookup_predicted``, ``lookup_ngram``) and the catch-up are the policy's: its ``observe`` adds them."""
        tokens = tuple(proposal.tokens)
        matches = tuple(int(getattr(t, "match_length", 0) or 0) if getattr(t, "from_lookup", False) else 0
                        for t in tokens)
        return cls(width=len(tokens), accepted=int(outcome.accepted), verify_ms=float(outcome.compute_ms),
                   round_ms=float(round_ms), draft_ms=float(proposal.compute_ms),
                   from_lookup=tuple(bool(getattr(t, "from_lookup", False)) for t in tokens),
                   drafter_called=drafter_called, propose_wall_ms=propose_wall_ms,
                   forward_rows=int(getattr(outcome, "forward_rows", 0) or 0),
                   matches=matches if any(matches) else ())
