"""Domain types shared by the three services. Plain Python: no numpy, torch or grpc here."""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.errors import InvalidInput

# temperature: 0 (greedy) or in [MIN_TEMPERATURE, MAX_TEMPERATURE]. Above zero, logits / temperature stays
# finite in float32 for any logit a model produces (|logit| < 3e34), and a temperature of 1e-4 is already
# greedy in practice.
MIN_TEMPERATURE = 1e-4
MAX_TEMPERATURE = 100.0


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen; the same warping applies to target_probs (p) and draft_probs (q).

    temperature 0 is greedy (argmax). Otherwise logits / temperature, then top-k (0 = off), then
    top-p (1.0 = off), then softmax. Sampled with a ``seed`` (an integer in [0, 2^64)) the session is
    ``coupled`` (tandem.coupling): every token is the target's own sample for that seed and its position,
    whatever the drafter proposes. Without one it uses rejection sampling from random generators.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def coupled(self) -> bool:
        """Sampled with a seed: drafter-invariant coupled sampling (verifier_service.acceptance)."""
        return self.seed is not None and not self.greedy

    @property
    def needs_draft_probs(self) -> bool:
        """Whether the verifier's rule reads q (draft_probs): rejection sampling does; greedy and coupled
        acceptance compare token ids only, so their drafts travel without q."""
        return not self.greedy and not self.coupled

    def validate(self) -> None:
        """Raises ValueError with a user-facing message when a setting is out of range."""
        # (the wire's float32 holds 1e-4 as 0.99999997e-4: within the tolerance)
        if not (self.temperature == 0.0 or 0.999999 * MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE):
            raise InvalidInput(f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE:g} and "
                               f"{MAX_TEMPERATURE:g}, got {self.temperature}", param="temperature")
        if not 0 <= self.top_k < 2**31:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):  # also rejects NaN
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 2**64):
            raise ValueError(f"seed must be an integer in [0, 2**64), got {self.seed!r}")


@dataclass(frozen=True)
class DraftToken:
    """One proposed token and, for sampled drafts, the distribution q it was drawn from.

    ``support_ids``/``support_probs`` give q on its support (q is 0 elsewhere); both are empty for
    greedy drafts, where only the token id matters. ``from_lookup``: the token was copied, not drawn
    from a model (q a point mass); ``origin`` says from where: "lookup" (prompt lookup, the default for a
    copied token) or "suffix" (suffix drafting over the drafter's traffic); "" for a model's draft.
    ``match_length``: for a suffix copy, the tokens before it that agreed with the text it was copied from
    (the context's matched suffix plus the block's copies before it; 0: not reported). A long match is
    usually right, a short one often not: the gateway prices a copy by it.
    """

    token_id: int
    support_ids: tuple[int, ...] = ()
    support_probs: tuple[float, ...] = ()
    from_lookup: bool = False       # copied (prompt lookup, suffix drafting): q a point mass
    origin: str = ""                # "" (a model's draft), "lookup" or "suffix"
    match_length: int = 0           # a suffix copy's matched tokens before it (0: not reported)

    def __post_init__(self):
        if self.from_lookup and not self.origin:
            object.__setattr__(self, "origin", "lookup")


@dataclass(frozen=True)
class Proposal:
    """A draft block: k tokens in order, and the drafter's compute time."""

    tokens: tuple[DraftToken, ...]
    compute_ms: float = 0.0

    @property
    def token_ids(self) -> list[int]:
        return [t.token_id for t in self.tokens]


@dataclass(frozen=True)
class VerifyOutcome:
    """Result of verifying one block: ``accepted`` draft tokens kept, then ``next_token``.

    ``next_token`` is the recovered token at the first rejected position, or the bonus token when
    the whole (non-empty) block was accepted (``bonus`` True). With an empty block it is simply the
    target's next token (plain decoding).

    Times (verifier side): ``forward_ms`` the target forward the block was part of (shared with the other
    sessions' blocks batched into it), ``compute_ms`` that forward plus the block's acceptance rule,
    ``queue_ms`` the wait before that forward (other forwards, prefill chunks); ``forward_rows`` the rows of
    that forward, this block's and the other sessions' (0: not reported).
    """

    accepted: int
    next_token: int
    bonus: bool
    compute_ms: float = 0.0
    queue_ms: float = 0.0
    forward_ms: float = 0.0
    forward_rows: int = 0


@dataclass(frozen=True)
class ModelInfo:
    """What a peer needs to know to check that drafter and target are compatible."""

    model_name: str
    vocab_size: int
    vocab_hash: str
    max_context: int
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    lookup: "LookupRule | None" = None    # a drafter's prompt lookup (None: none, or a verifier)
    model_free: bool = False              # a drafter with no model (suffix drafting): serves any vocabulary
    follow_path: bool = False             # the gateway follows its drafted-ahead path, never waits for it


@dataclass(frozen=True)
class LookupRule:
    """The prompt lookup a drafter runs before its model (``tandem.lookup.find_lookup``'s n-gram bounds);
    tokens found by an n-gram shorter than ``trust_ngram`` are checked against the model."""

    max_ngram: int
    min_ngram: int
    trust_ngram: int = 1

    def copies_unchecked(self, ngram: int) -> bool:
        """Whether tokens found by an ``ngram``-token match go out as found, without a model check."""
        return self.max_ngram > 0 and ngram >= max(1, self.min_ngram) and ngram >= self.trust_ngram


@dataclass(frozen=True)
class TargetInfo:
    """The verifier's description of its target: model info, and its tokenizer and chat template so the
    gateway tokenizes exactly as the target does."""

    model: ModelInfo
    tokenizer_json: str = ""
    chat_template: str = ""
    bos_token: str = ""
    eos_token: str = ""
    verify_ms_by_width: dict[int, float] = field(default_factory=dict)   # measured at the verifier's start
