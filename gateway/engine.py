"""One request from prompt to text: tokenize, validate, check the drafter, run the rounds, free sessions.

Domain only: the gRPC client-facing servicer (``gateway.api``) converts protobuf to a
``GenerateParams`` and a stream of ``Step`` back. Errors are ``tandem.errors`` (one table maps them to
gRPC and HTTP statuses). Nothing heavy runs on the event loop that serves every client: a prompt is
refused above --max-request-bytes before any work, and templated and tokenized on worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import math
import secrets
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gateway import tracing
from gateway.config import LOOKUP_ONLY_NAME, LOOKUP_ONLY_RULE, GatewayConfig
from gateway.detokenizer import IncrementalDetokenizer, skipped_ids
from gateway.draft_length import (COPYING_PRIOR_WEIGHT, PRIOR_WEIGHT, AcceptanceEstimator, AutoDraftLength,
                                  CostModel, DraftLengthPolicy, PinnedDraftLength, ProbeRule, ProbeSchedule)
from gateway.metrics import GatewayMetrics
from gateway.ports import DrafterUnavailable
from gateway.rounds import Request, generate_rounds
from gateway.stats import RequestStats
from tandem import telemetry
from tandem.draft_checks import check_ids
from tandem.errors import IncompatibleDrafter, InvalidInput, Overloaded  # noqa: F401 - raised here, re-exported
from tandem.memory import release_freed_memory
from tandem.round_record import Round
from tandem.types import ModelInfo, SamplingParams, TargetInfo


@dataclass(frozen=True)
class GenerateParams:
    prompt: str = ""
    prompt_ids: tuple[int, ...] = ()
    chat: bool = False
    max_tokens: int = 128
    sampling: SamplingParams = SamplingParams()
    draft_length: int = 0           # 0: the gateway's default (auto unless it pins one); N: pinned to N
    no_speculation: bool = False
    ignore_eos: bool = False
    draft_confidence: float | None = None   # None: the gateway's default; 0: always draft_length tokens
    cache_salt: str = ""            # the verifier's prefix cache is shared only among requests of one salt


@dataclass(frozen=True)
class Step:
    """What one round adds for the client: token ids, the text they complete, and that text per token
    (``pieces[i]``: what ``token_ids[i]`` completes; they add up to ``text``)."""

    round: Round
    token_ids: tuple[int, ...]
    text: str
    pieces: tuple[str, ...] = ()


_BUILT_AHEAD: dict[str, object] = {}     # tokenizers built before their TargetInfo arrived, by _tokenizer_key


def _tokenizer_key(tokenizer_json: str, bos_token: str, eos_token: str) -> str:
    return hashlib.sha256("\0".join((tokenizer_json, bos_token, eos_token)).encode()).hexdigest()


def _tokenizer_from_json(tokenizer_json: str, bos_token: str, eos_token: str):
    """A transformers fast tokenizer from tokenizers' JSON, read from a file: given a ``tokenizers.Tokenizer``
    instead, transformers deep-copies it, a second parse of the whole JSON (Gemma 3's 262 k vocabulary: 2.4 s
    against 1.2 s). Then the C heap the parse freed goes back to the system (``tandem.memory``)."""
    from transformers import PreTrainedTokenizerFast

    with tempfile.TemporaryDirectory(prefix="tandem-tokenizer-") as tmp:
        path = Path(tmp) / "tokenizer.json"
        path.write_text(tokenizer_json, encoding="utf-8")
        tok = PreTrainedTokenizerFast(tokenizer_file=str(path), bos_token=bos_token or None,
                                      eos_token=eos_token or None)
    release_freed_memory()
    return tok


def build_tokenizer_ahead(tokenizer_json: str, bos_token: str, eos_token: str) -> None:
    """Builds the tokenizer a later ``build_tokenizer`` with this JSON and these special tokens returns. Parsing a
    262 k vocabulary's JSON holds ~420 MB for a moment: a gateway that loads the target in its own process
    (``--verifier local``) builds it first, while the process is small, so that moment is not on top of the
    target's memory (Gemma 3 270M under tandem up: the process's peak 1 043 -> 770 MB, BENCHMARKS.md, thirty-sixth
    session)."""
    _BUILT_AHEAD[_tokenizer_key(tokenizer_json, bos_token, eos_token)] = _tokenizer_from_json(
        tokenizer_json, bos_token, eos_token)


def build_tokenizer(target_info: TargetInfo):
    """A transformers fast tokenizer rebuilt from the verifier's tokenizer JSON and chat template (the one built
    ahead for the same JSON, if any)."""
    key = _tokenizer_key(target_info.tokenizer_json, target_info.bos_token, target_info.eos_token)
    tok = _BUILT_AHEAD.pop(key, None)
    _BUILT_AHEAD.clear()            # one built for another JSON (a target served another way) is never used
    if tok is None:
        tok = _tokenizer_from_json(target_info.tokenizer_json, target_info.bos_token, target_info.eos_token)
    if target_info.chat_template:
        tok.chat_template = target_info.chat_template
    return tok


def _raise_if_cancelled() -> None:
    """Raises CancelledError if the task running the request was asked to stop (its client left) and the
    request goes on all the same: the cancellation was lost on its way. Python 3.11's ``asyncio.wait_for``
    returns a result that arrived in the same loop turn and drops the cancel, and a gRPC call can do the
    same; neither takes back the task's request (``Task.cancelling``), so a round boundary sees it."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError("the request's task was cancelled")


class Gateway:
    def __init__(self, verifier, drafter, target_info: TargetInfo, config: GatewayConfig):
        """verifier: VerifierPort (+ target_info from its GetInfo); drafter: DrafterPort or None."""
        self.verifier = verifier
        self.drafter = drafter
        self.config = config
        self.target: ModelInfo = target_info.model
        self.tokenizer = build_tokenizer(target_info)
        # chat templating and tokenizing of prompts (seconds for a long one), off the event loop
        self.tokenizing = ThreadPoolExecutor(2, thread_name_prefix="tandem-tokenize")
        self._skip_ids = skipped_ids(self.tokenizer)     # what decode(skip_special_tokens=True) drops
        # What the draft-length choice learns (gateway.draft_length): costs of this verifier + drafter pair,
        # seeded from the verifier's start-up profile; acceptance gateway-wide, greedy and sampled apart.
        self.cost = CostModel(shared_cpus=config.drafter_shares_cpus)
        if target_info.verify_ms_by_width:
            self.cost.seed(target_info.verify_ms_by_width)
        self.acceptance = {True: AcceptanceEstimator(alpha=0.02), False: AcceptanceEstimator(alpha=0.02)}
        self.probe_schedules = {True: ProbeSchedule(), False: ProbeSchedule()}   # shared by auto requests, per mode
        self.metrics = GatewayMetrics()         # Prometheus registry, served by --metrics-port
        self.metrics.watch(self.status)
        self._drafter_info: ModelInfo | None = None
        self._drafter_down_since: float | None = None
        self.drafter_down_reason = ""
        self._drafter_probe: asyncio.Task | None = None
        self._background: set[asyncio.Future] = set()
        self.active_requests = 0

    @contextlib.asynccontextmanager
    async def admit(self):
        """Holds one of --max-concurrent-requests slots for a request; raises Overloaded when none is free."""
        limit = self.config.max_concurrent_requests
        if limit and self.active_requests >= limit:
            raise Overloaded(f"the gateway is already serving {limit} requests (--max-concurrent-requests); "
                             "retry later")
        self.active_requests += 1
        try:
            yield
        finally:
            self.active_requests -= 1

    # ---- the drafter's health and compatibility ----------------------------------------------
    async def usable_drafter(self):
        """The drafter if it is up and shares the target's vocabulary; None (with a reason) if down."""
        if self.drafter is None:
            return None
        if self._drafter_down_since is not None:
            return None                     # a background probe brings it back (mark_drafter_down)
        if self._drafter_info is None:
            try:
                info = await self.drafter.info()
            except DrafterUnavailable as exc:
                self.mark_drafter_down(str(exc))
                return None
            if not info.model_free and info.vocab_hash != self.target.vocab_hash:    # model-free: any target
                raise IncompatibleDrafter(
                    f"the drafter ({info.model_name}, vocab {info.vocab_size}, {info.vocab_hash[:19]}…) does not "
                    f"share the target's vocabulary ({self.target.model_name}, vocab {self.target.vocab_size}, "
                    f"{self.target.vocab_hash[:19]}…): export a drafter with the target's tokenizer, serve the "
                    "model-free drafter (tandem serve-drafter --drafter suffix), or use --no-speculation")
            self._drafter_info = info
            await self._ping_drafter()
        self._drafter_down_since = None
        self.drafter_down_reason = ""
        return self.drafter

    async def _ping_drafter(self, pings: int = 3) -> None:
        """Times GetInfo (the fastest of ``pings``; the first call may include a TLS handshake) and seeds the
        cost model's drafter round trip with it, so the first blocks behind a slow link are chosen knowing it."""
        best = math.inf
        for _ in range(pings):
            t0 = time.perf_counter()
            try:
                await self.drafter.info()
            except DrafterUnavailable:
                return                      # the next Propose finds out; nothing to seed
            best = min(best, (time.perf_counter() - t0) * 1e3)
        self.cost.seed_drafter_round_trip(best)

    def mark_drafter_down(self, reason: str) -> None:
        if self._drafter_down_since is None:       # log the change, not every request that follows it
            print(f"[tandem] gateway: speculation off, decoding with the target alone until the drafter is back: "
                  f"{reason}", file=sys.stderr, flush=True)
        self._drafter_down_since = time.monotonic()
        self._drafter_info = None           # re-check compatibility when it is back (it may be another model)
        self.drafter_down_reason = reason
        if self._drafter_probe is None or self._drafter_probe.done():
            with contextlib.suppress(RuntimeError):       # no running loop: the next request retries
                self._drafter_probe = asyncio.get_running_loop().create_task(self._probe_drafter())

    @property
    def drafter_healthy(self) -> bool:
        return self.drafter is not None and self._drafter_down_since is None

    async def _probe_drafter(self) -> None:
        """Asks a failed drafter for its info with exponential backoff until it answers; requests meanwhile
        decode with the target alone and never wait for it. Once back, the next request speculates."""
        delay = self.config.drafter_retry_s
        while self._drafter_down_since is not None:
            await asyncio.sleep(delay)
            try:
                info = await self.drafter.info(wait_s=min(max(delay, 1.0), 5.0))
            except DrafterUnavailable as exc:
                self.drafter_down_reason = str(exc)
                delay = min(delay * 2, self.config.drafter_retry_max_s)
                continue
            except Exception as exc:                      # noqa: BLE001 - keep probing whatever went wrong
                self.drafter_down_reason = f"drafter probe failed: {exc!r}"
                delay = min(delay * 2, self.config.drafter_retry_max_s)
                continue
            self._drafter_info = info if info.model_free or info.vocab_hash == self.target.vocab_hash else None
            self._drafter_down_since = None
            self.drafter_down_reason = ""

    def status(self) -> dict:
        """What ``tandem health --verbose`` and the metrics show: the drafter's state and what the draft-length
        choice has measured."""
        return {"target_model": self.target.model_name, "draft_model": self.drafter_name,
                "drafter_up": self.drafter_healthy, "drafter_down_reason": self.drafter_down_reason,
                "active_requests": self.active_requests, "cost_model": self.cost.table(),
                "acceptance_greedy": self.acceptance[True].table(), "acceptance_sampled": self.acceptance[False].table()}

    @property
    def drafter_name(self) -> str:
        return self._drafter_info.model_name if self._drafter_info else ""

    # ---- a request ---------------------------------------------------------------------------
    def check_request_size(self, prompt: str) -> None:
        """Refuses a prompt longer than --max-request-bytes before any work is done on it (a character is at
        least a byte: no encoding needed for the check)."""
        limit = self.config.max_request_bytes
        if limit and len(prompt) > limit:
            raise InvalidInput(f"the prompt has {len(prompt)} characters, more than the gateway's --max-request-bytes "
                               f"({limit}): send a shorter one, or raise the limit", param="prompt")

    async def off_loop(self, fn, *args):
        """``fn(*args)`` on a tokenizing thread (the event loop goes on serving every other client meanwhile)."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenizing, fn, *args)

    async def tokenize(self, params: GenerateParams) -> list[int]:
        """The request's prompt ids: as given, or its text templated and tokenized off the event loop, after
        the size check."""
        if params.prompt_ids:
            return list(params.prompt_ids)
        self.check_request_size(params.prompt)
        return await self.off_loop(self.prompt_ids, params)

    def prompt_ids(self, params: GenerateParams) -> list[int]:
        """Tokenizes (blocking: ``tokenize`` runs this on a worker thread)."""
        if params.prompt_ids:
            return list(params.prompt_ids)
        if not params.prompt.strip():
            raise InvalidInput("the prompt is empty", param="prompt")
        if params.chat:
            if not self.tokenizer.chat_template:
                raise InvalidInput("the target has no chat template; send the prompt without --chat", param="chat")
            return self.chat_prompt_ids([{"role": "user", "content": params.prompt}])
        return self.tokenizer(params.prompt)["input_ids"]

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        """Messages in the target's chat template, the assistant's turn opened, as ids (blocking; the caller checks
        there is a template). The one place a chat is templated: gRPC's ``chat`` prompt, HTTP's messages."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def validate(self, params: GenerateParams, prompt_ids: list[int]) -> int:
        """Checks the request (InvalidInput naming the field); returns the pinned draft length (0: auto)."""
        limit = self.config.max_tokens_limit
        if not 1 <= params.max_tokens <= limit:
            raise InvalidInput(f"max_tokens must be between 1 and {limit}, got {params.max_tokens}", param="max_tokens")
        params.sampling.validate()
        if not prompt_ids:
            raise InvalidInput("the prompt is empty", param="prompt")
        if len(prompt_ids) >= self.target.max_context:
            raise InvalidInput(f"the prompt has {len(prompt_ids)} tokens, longer than the target's context of "
                               f"{self.target.max_context} tokens", param="prompt")
        if self.config.max_prompt_tokens and len(prompt_ids) > self.config.max_prompt_tokens:
            raise InvalidInput(f"the prompt has {len(prompt_ids)} tokens, more than the gateway's --max-prompt-tokens "
                               f"({self.config.max_prompt_tokens})", param="prompt")
        if not 0 <= params.draft_length <= self.config.max_pinned_draft_length:
            raise InvalidInput(f"draft_length must be between 0 (auto) and {self.config.max_pinned_draft_length}",
                               param="draft_length")
        if params.draft_confidence is not None and not 0.0 <= params.draft_confidence < 1.0:
            raise InvalidInput(f"draft_confidence must be in [0, 1), got {params.draft_confidence}",
                               param="draft_confidence")
        if self.target.vocab_size:
            try:
                check_ids(prompt_ids, self.target.vocab_size, "prompt_ids")
            except ValueError as exc:
                raise InvalidInput(str(exc), param="prompt") from None
        return params.draft_length or self.config.draft_length

    def drafting_context(self) -> int:
        """The longest sequence a round drafts after: the target's context, or the drafter's if shorter (it
        refuses a longer one)."""
        theirs = self._drafter_info.max_context if self._drafter_info else 0
        return min(self.target.max_context, theirs) if theirs > 0 else self.target.max_context

    @property
    def drafts_ahead(self) -> bool:
        """Whether drafters draft the next block while the verifier checks this one (DraftAhead): not when the
        drafter computes on the verifier's cores."""
        return self.config.draft_ahead and not self.config.drafter_shares_cpus

    def follows_paths(self, drafter) -> bool:
        """Whether a request's drafter is followed by its path (gateway/proposal.py): a model-free node, or one
        that asks to be (``ModelInfo.follow_path``: the target's own file as the drafter)."""
        info = self._drafter_info
        return (self.drafts_ahead and drafter is not None and info is not None
                and (info.model_free or info.follow_path))

    def max_block(self, follow: bool) -> int:
        """The longest block auto verifies: ``--max-draft-length``, or beside a followed model-free node, whose
        blocks are copies already at the gateway, ``--max-copy-length`` if longer."""
        return max(self.config.max_draft_length, self.config.max_copy_length) if follow else self.config.max_draft_length

    def draft_length_policy(self, pinned: int, sampling: SamplingParams, max_block: int | None = None
                            ) -> DraftLengthPolicy:
        """The request's draft-length choice: ``pinned`` k > 0 always drafts k; 0 chooses every round from the
        gateway's measured costs and this session's acceptance (starting from the gateway-wide figures, which
        count for less beside a model-free node: ``acceptance.COPYING_PRIOR_WEIGHT``), blocks of at most
        ``max_block`` (default ``--max-draft-length``)."""
        copying = self._drafter_info is not None and self._drafter_info.model_free
        acceptance = AcceptanceEstimator(prior=self.acceptance[sampling.greedy],
                                         prior_weight=COPYING_PRIOR_WEIGHT if copying else PRIOR_WEIGHT)
        if pinned:
            return PinnedDraftLength(self.cost, acceptance, pinned)
        followed_model = (self._drafter_info is not None and self._drafter_info.follow_path
                          and not self._drafter_info.model_free)
        return AutoDraftLength(self.cost, acceptance, max_draft_length=max_block or self.config.max_draft_length,
                               probing=ProbeRule(budget=self.config.probe_budget, copies=not followed_model),
                               schedule=self.probe_schedules[sampling.greedy])

    def session_sampling(self, sampling: SamplingParams) -> SamplingParams:
        """What both nodes are given: the request's settings, with a secret seed (never reported) for a sampled
        request without one when unseeded requests are coupled (``GatewayConfig.unseeded_sampling``)."""
        if sampling.greedy or sampling.seed is not None or self.config.unseeded_sampling != "coupled":
            return sampling
        return dataclasses.replace(sampling, seed=secrets.randbits(64))

    def _lookup_rule(self, drafter, copying: bool):
        """The prompt-lookup rule the gateway predicts (and copies by, where it may) each round: its own with
        --lookup-only; the drafter's (its GetInfo) otherwise; and the same own rule beside a followed node that
        serves none (a suffix node, the target's own file): copying a match here costs no round trip to the node,
        and a round verifies the copy or the node's path, whichever is expected to keep more."""
        if copying:
            return LOOKUP_ONLY_RULE
        info = self._drafter_info if drafter is not None else None
        if info is None:
            return None
        if (info.model_free or info.follow_path) and (info.lookup is None or info.lookup.max_ngram <= 0):
            return LOOKUP_ONLY_RULE
        return info.lookup

    def draft_confidence(self, params: GenerateParams) -> float:
        """The confidence stop of a request: its own value, else the gateway's default."""
        return self.config.draft_confidence if params.draft_confidence is None else float(params.draft_confidence)

    async def generate(self, params: GenerateParams, stats: RequestStats) -> AsyncIterator[Step]:
        """Runs one request; yields a Step per round (the prefill first). Frees both sessions at the end,
        also when the client goes away (the generator is closed / cancelled)."""
        prompt_ids = await self.tokenize(params)
        pinned = self.validate(params, prompt_ids)          # 0: auto
        speculate = not (params.no_speculation or self.config.no_speculation)
        drafter = await self.usable_drafter() if speculate and not self.config.lookup_only else None
        follow = self.follows_paths(drafter)                # a model-free node: blocks from its path only
        k = pinned or self.max_block(follow)                # the most a round may draft
        copying = speculate and self.config.lookup_only         # speculation by gateway lookup copies alone
        stats.prompt_tokens = len(prompt_ids)
        stats.target_model = self.target.model_name
        stats.speculative = drafter is not None or copying
        stats.draft_model = self.drafter_name if drafter is not None else LOOKUP_ONLY_NAME if copying else ""
        if speculate and drafter is None and not copying:
            stats.fallback_reason = self.drafter_down_reason or "no drafter configured"
        # Not made current: it lives across this generator's yields. Prefill and rounds get it as parent.
        span = tracing.start_request_span(params, self.target.model_name, k if drafter is not None else 0,
                                            stats.draft_model)
        ahead = self.drafts_ahead
        request = Request(session_id=uuid.uuid4().hex, verifier_token=secrets.token_hex(16),
                          drafter_token=secrets.token_hex(16), vocab_size=self.target.vocab_size,
                          prompt_ids=tuple(prompt_ids),
                          max_tokens=min(params.max_tokens, self.target.max_context - len(prompt_ids)),
                          sampling=self.session_sampling(params.sampling),
                          k=k if drafter is not None or copying else 0, lookup_only=copying,
                          min_confidence=self.draft_confidence(params),
                          eos_token_ids=frozenset() if params.ignore_eos else frozenset(self.target.eos_token_ids),
                          max_context=self.drafting_context(), trace_context=telemetry.context_with(span),
                          lookup=self._lookup_rule(drafter, copying),
                          local_lookup=self.config.local_lookup,
                          draft_ahead=ahead, plain_ahead=self.config.plain_ahead if ahead else 0,
                          follow_paths=follow,
                          drafter_timeout_s=getattr(drafter, "timeout_s", 15.0), cache_salt=params.cache_salt)
        generated: list[int] = []
        detokenizer = IncrementalDetokenizer(self.tokenizer, skip_ids=self._skip_ids)   # new text only, each round
        self.metrics.active_sessions.inc()
        rounds = None
        try:
            policy = (self.draft_length_policy(pinned, params.sampling, k) if drafter is not None or copying
                      else None)
            rounds = generate_rounds(request, self.verifier, drafter, policy)
            async for rnd in rounds:
                _raise_if_cancelled()
                stats.add(rnd)
                self.metrics.round(rnd, stats)
                if rnd.fallback_reason and request.session_id not in getattr(drafter, "refused", ()):
                    self.mark_drafter_down(rnd.fallback_reason)     # not for one session the drafter had no room for
                generated.extend(rnd.tokens)
                pieces = tuple(detokenizer.push_pieces(rnd.tokens))
                yield Step(rnd, rnd.tokens, "".join(pieces), pieces)
            tail = detokenizer.flush()        # a character the last token left incomplete (as U+FFFD)
            if tail:
                yield Step(rnd, (), tail)
            self.metrics.finished(stats.finish(), self.finish_reason(generated, params))
        except Exception as exc:
            telemetry.record_error(span, exc)
            raise
        finally:
            if rounds is not None:
                with contextlib.suppress(Exception):
                    await rounds.aclose()           # ends the drafting-ahead stream now, not at collection
            with contextlib.suppress(Exception):
                lost = await asyncio.shield(self._end_sessions(request, drafter))
                if lost:                    # it died after its last Propose (a plain streak, the last round)
                    stats.fallback_reason = stats.fallback_reason or lost
                    self.mark_drafter_down(lost)
            stats.finish()
            self.metrics.active_sessions.dec()
            tracing.end_request_span(span, stats, self.finish_reason(generated, params))

    async def _end_sessions(self, request: Request, drafter) -> str | None:
        """Ends the request's sessions; returns why the drafter could not be reached, if it could not."""
        ends = [self.verifier.end(request.session_id, request.verifier_token)]
        if drafter is not None and self.drafter_healthy:
            ends.append(drafter.end(request.session_id, request.drafter_token))
        elif drafter is not None:           # a drafter that failed must not delay the reply: try in the background
            task = asyncio.ensure_future(drafter.end(request.session_id, request.drafter_token))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        results = await asyncio.gather(*ends, return_exceptions=True)
        return results[1] if len(results) > 1 and isinstance(results[1], str) else None

    def finish_reason(self, generated: list[int], params: GenerateParams) -> str:
        return "stop" if generated and generated[-1] in self.target.eos_token_ids and not params.ignore_eos else "length"
