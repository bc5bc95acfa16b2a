"""POST /v1/chat/completions and POST /v1/completions: an OpenAI request through the engine to its reply.

A request's body is parsed (``gateway.openai_schema``), a chat's messages templated and tokenized (by the
engine's ``chat_prompt_ids``), all on the gateway's tokenizing threads; ``Generation`` runs it on the
engine, holding the admission slot, and gives its text round by round, cut at a stop string; the reply is
one JSON object, or with ``stream: true`` server-sent chunks ending in ``data: [DONE]``. Refusals before
the first token are HTTP errors; an error once a stream has started is sent as an event in the stream.

Besides OpenAI's fields, replies carry a ``tandem`` object with the speculation statistics, and stream
chunks carry ``tandem.tokens`` = [{"text", "origin": draft|lookup|target}].
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.engine import Gateway, GenerateParams
from gateway.http_errors import client_error, error_response
from gateway.http_guard import require_token
from gateway.http_stream import EventStream, sse, until_disconnect
from gateway.openai_schema import ApiError, Parsed, PieceCutter, parse_chat, parse_completion
from gateway.stats import RequestStats


# ---- the pieces of a reply ---------------------------------------------------------------------
def tandem_stats(stats: RequestStats) -> dict:
    """The ``tandem`` extension: what the gRPC GenerateStats says about speculation, in brief."""
    return {
        "speculative": stats.speculative, "draft_model": stats.draft_model, "target_model": stats.target_model,
        "acceptance_length": round(stats.mean_acceptance_length, 4), "acceptance_rate": round(stats.acceptance_rate, 4),
        "rounds": stats.rounds, "accepted": stats.accepted, "proposed": stats.proposed,
        "new_tokens": stats.new_tokens, "draft_ms": round(stats.draft_ms, 3), "verify_ms": round(stats.verify_ms, 3),
        "overhead_ms": round(stats.overhead_ms, 3), "prefill_ms": round(stats.prefill_ms, 3),
        "ttft_ms": round(stats.ttft_ms, 3), "total_ms": round(stats.total_ms, 3),
        "tokens_per_second": round(stats.tokens_per_second, 2), "fallback_reason": stats.fallback_reason,
    }


def live_stats(stats: RequestStats) -> dict:
    """The ``tandem`` figures a stream chunk carries: the request's statistics so far."""
    elapsed = time.perf_counter() - stats.started
    return {"acceptance_length": round(stats.mean_acceptance_length, 4), "rounds": stats.rounds,
            "accepted": stats.accepted, "proposed": stats.proposed, "new_tokens": stats.new_tokens,
            "tokens_per_second": round(stats.new_tokens / elapsed, 2) if elapsed > 0 else 0.0,
            "speculative": stats.speculative}


def usage(stats: RequestStats) -> dict:
    """OpenAI's ``usage``: prompt and completion tokens."""
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.new_tokens,
            "total_tokens": stats.prompt_tokens + stats.new_tokens}


# ---- one generation ----------------------------------------------------------------------------
@dataclass
class Delta:
    """What one round adds for the client after stop strings: text and its tokens (with origins)."""

    text: str
    tokens: list[dict]


class Generation:
    """One request on the engine: holds the admission slot and the engine's generator, and closes both
    (which frees the verifier's and the drafter's sessions) however it ends."""

    def __init__(self, gateway: Gateway, parsed: Parsed, params: GenerateParams):
        self.gateway, self.parsed, self.params = gateway, parsed, params
        self.stats = RequestStats()
        self.token_ids: list[int] = []
        self.cutter = PieceCutter(parsed.stop)
        self.finish_reason: str | None = None
        self._stack = contextlib.AsyncExitStack()
        self._steps: AsyncIterator | None = None
        self._first = None

    async def start(self) -> None:
        """Admits the request and runs the prefill, so that refusals become HTTP errors before any reply."""
        try:
            await self._stack.enter_async_context(self.gateway.admit())
            self._steps = await self._stack.enter_async_context(
                contextlib.aclosing(self.gateway.generate(self.params, self.stats)))
            self._first = await anext(self._steps, None)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        await self._stack.aclose()

    async def deltas(self) -> AsyncIterator[Delta]:
        """The text round by round (already cut at a stop string); sets ``finish_reason`` at the end."""
        step = self._first
        while step is not None:
            self.token_ids.extend(step.token_ids)
            pieces = [{"text": p, "origin": o, "id": t} for p, o, t in zip(step.pieces, step.round.origins,
                                                                          step.token_ids)]
            if step.text and not step.token_ids:        # the flushed end of an incomplete character
                pieces = [{"text": step.text, "origin": "target", "id": None}]
            text, tokens = self.cutter.feed(pieces)
            if text or tokens:
                yield Delta(text, tokens)
            if self.cutter.stopped:
                self.finish_reason = "stop"
                break
            step = await anext(self._steps, None)
        await self.close()              # frees the sessions now (also after a stop string)
        if self.finish_reason is None:
            text, tokens = self.cutter.flush()
            if text or tokens:
                yield Delta(text, tokens)
            self.finish_reason = self.gateway.finish_reason(self.token_ids, self.params)


# ---- the endpoints -----------------------------------------------------------------------------
class Completions:
    """The two generating endpoints over ``gateway`` (``token``: the bearer token they require, if any;
    ``model_name``: the name replies carry)."""

    def __init__(self, gateway: Gateway, token: str | None, model_name: str):
        self.gateway, self.token, self.model_name = gateway, token, model_name

    def prepare(self, raw: bytes, chat: bool) -> tuple[Parsed, GenerateParams]:
        """The request body -> the engine's parameters: JSON, the OpenAI fields, a chat's template and tokens
        (blocking work: runs on the gateway's tokenizing threads)."""
        try:
            body = json.loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from exc
        except RecursionError as exc:          # arrays or objects nested deeper than the parser's stack
            raise ApiError(400, "the request body nests arrays or objects too deeply", code="invalid_json") from exc
        parsed = parse_chat(body) if chat else parse_completion(body)
        return parsed, self.params(parsed)

    def params(self, parsed: Parsed) -> GenerateParams:
        """A parsed request in the engine's terms: a chat's messages as prompt ids (blocking), ``max_tokens``
        defaulted to what the gateway and the target's context allow."""
        if parsed.chat:
            if not self.gateway.tokenizer.chat_template:
                raise ApiError(400, "the target model has no chat template: use /v1/completions",
                               param="messages", code="no_chat_template")
            try:
                prompt_ids = tuple(self.gateway.chat_prompt_ids(parsed.messages))
            except Exception as exc:  # noqa: BLE001 - a template may refuse a conversation (roles, order)
                raise ApiError(400, f"the chat template refused the messages: {exc}", param="messages") from exc
            if not prompt_ids:
                raise ApiError(400, "the prompt is empty", param="messages")
            prompt, ids = "", prompt_ids
        else:
            prompt, ids = parsed.prompt, parsed.prompt_ids
        max_tokens = parsed.max_tokens
        if max_tokens is None:
            config = getattr(self.gateway, "config", None)
            max_tokens = min(getattr(config, "max_tokens_limit", 4096), self.gateway.target.max_context)
        return GenerateParams(prompt=prompt, prompt_ids=ids, max_tokens=max_tokens, sampling=parsed.sampling,
                              draft_length=parsed.draft_length, no_speculation=parsed.no_speculation,
                              ignore_eos=parsed.ignore_eos, draft_confidence=parsed.draft_confidence,
                              cache_salt=parsed.cache_salt)

    def echoed(self, parsed: Parsed) -> str:
        """A completion's prompt as text, for ``echo``: as sent, or its token ids decoded."""
        return parsed.prompt or self.gateway.tokenizer.decode(list(parsed.prompt_ids))

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def _generate(self, request: Request, chat: bool) -> Response:
        try:
            require_token(request, self.token)
            parsed, params = await self.gateway.off_loop(self.prepare, await request.body(), chat)
            gen = Generation(self.gateway, parsed, params)
            started = await until_disconnect(request.receive, self._start(gen))
            if started is None:
                await gen.close()
                return Response(status_code=499)     # nobody is listening any more
        except Exception as exc:
            return error_response(client_error(exc, chat))
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        if parsed.stream:
            return EventStream(self._stream(gen, rid, created, chat), gen.close)
        try:
            reply = await until_disconnect(request.receive, self._collect(gen, rid, created, chat))
        except Exception as exc:
            return error_response(client_error(exc, chat))
        finally:
            await gen.close()
        return JSONResponse(reply) if reply is not None else Response(status_code=499)

    async def _start(self, gen: Generation) -> bool:
        await gen.start()
        return True

    async def _collect(self, gen: Generation, rid: str, created: int, chat: bool) -> dict:
        text = "".join([d.text async for d in gen.deltas()])
        if gen.parsed.echo and not chat:
            text = self.echoed(gen.parsed) + text
        choice = ({"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                   "logprobs": None, "finish_reason": gen.finish_reason} if chat else
                  {"index": 0, "text": text, "logprobs": None, "finish_reason": gen.finish_reason})
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": self.model_name, "system_fingerprint": None, "choices": [choice],
                "usage": usage(gen.stats), "tandem": tandem_stats(gen.stats)}

    async def _stream(self, gen: Generation, rid: str, created: int, chat: bool) -> AsyncIterator[bytes]:
        obj = "chat.completion.chunk" if chat else "text_completion"
        include_usage = gen.parsed.include_usage

        def chunk(delta_or_text, finish=None, extra=None):
            choice = ({"index": 0, "delta": delta_or_text, "logprobs": None, "finish_reason": finish} if chat else
                      {"index": 0, "text": delta_or_text, "logprobs": None, "finish_reason": finish})
            out = {"id": rid, "object": obj, "created": created, "model": self.model_name,
                   "system_fingerprint": None, "choices": [choice]}
            if include_usage:
                out["usage"] = None
            if extra is not None:
                out["tandem"] = extra
            return sse(out)

        try:
            if chat:
                yield chunk({"role": "assistant", "content": ""})
            elif gen.parsed.echo:
                yield chunk(self.echoed(gen.parsed))
            async for d in gen.deltas():
                extra = {"tokens": [{"text": t["text"], "origin": t["origin"], **({"continued": True}
                                     if t.get("continued") else {})} for t in d.tokens], **live_stats(gen.stats)}
                yield chunk({"content": d.text} if chat else d.text, extra=extra)
            gen.stats.finish()
            yield chunk({} if chat else "", gen.finish_reason, tandem_stats(gen.stats))
            if include_usage:
                yield sse({"id": rid, "object": obj, "created": created, "model": self.model_name,
                           "system_fingerprint": None, "choices": [], "usage": usage(gen.stats),
                           "tandem": tandem_stats(gen.stats)})
        except Exception as exc:        # mid-stream: the status is sent already; say it in the stream
            yield sse(client_error(exc, chat).body())
        finally:
            await gen.close()
        yield b"data: [DONE]\n\n"
