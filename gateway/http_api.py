"""The OpenAI-compatible HTTP API of the gateway and its chat page, over the same engine as the gRPC API.

    app = build_app(gateway, token=security.token, model_name="tandem")
    handle = await serve_http(app, "127.0.0.1", 8000)         # in the gateway's own event loop
    ...
    await handle.stop()

Endpoints: POST /v1/chat/completions, POST /v1/completions (both with ``stream: true`` as server-sent
events ending in ``data: [DONE]``), GET /v1/models, GET /health (200 when the verifier answers, else 503),
and the chat page at / (static files in gateway/static/).

Extensions: ``top_k``; ``ignore_eos``; ``no_speculation`` or ``"tandem": {"speculation": false,
"draft_length": k, "draft_confidence": c}``. Replies carry ``usage`` and a ``tandem`` object with the
speculation statistics; stream chunks carry ``tandem.tokens`` = [{"text", "origin": draft|lookup|target}].

Errors have OpenAI's shape {"error": {"message", "type", "param", "code"}}: 400 bad or unsupported input
(also the engine's ValueError), 401 without the bearer token when one is configured, 404 unknown model,
429 over --max-concurrent-requests, 503 verifier unreachable, 502 other verifier failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from gateway.engine import Gateway, GenerateParams, IncompatibleDrafter, Overloaded
from gateway.openai_schema import (ApiError, Parsed, PieceCutter, TokenPieces, param_of, parse_chat,
                                   parse_completion)
from gateway.stats import RequestStats
from tandem.security import bearer_matches

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


# ---- errors ------------------------------------------------------------------------------------
def error_from_exception(exc: BaseException) -> ApiError | None:
    """The client's error for an exception of the engine or the verifier (as gateway.api maps them)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, Overloaded):
        return ApiError(429, str(exc), type="requests", code="rate_limit_exceeded")
    if isinstance(exc, IncompatibleDrafter):
        return ApiError(400, str(exc), code="incompatible_drafter", param="tandem.speculation")
    if isinstance(exc, ValueError):
        return ApiError(400, str(exc), param=param_of(str(exc)), code="invalid_value")
    if isinstance(exc, grpc.aio.AioRpcError):          # from the verifier
        code, details = exc.code(), f"verifier: {exc.details()}"
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return ApiError(503, details, type="server_error", code="verifier_unavailable")
        if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE):
            return ApiError(400, details, param=param_of(details), code="invalid_value")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return ApiError(429, details, type="requests", code="rate_limit_exceeded")
        return ApiError(502, f"{details} ({code.name})", type="server_error", code="verifier_error")
    return None


def error_response(err: ApiError) -> JSONResponse:
    headers = {"www-authenticate": "Bearer"} if err.status == 401 else None
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


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
    elapsed = time.perf_counter() - stats.started
    return {"acceptance_length": round(stats.mean_acceptance_length, 4), "rounds": stats.rounds,
            "accepted": stats.accepted, "proposed": stats.proposed, "new_tokens": stats.new_tokens,
            "tokens_per_second": round(stats.new_tokens / elapsed, 2) if elapsed > 0 else 0.0,
            "speculative": stats.speculative}


def usage(stats: RequestStats) -> dict:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.new_tokens,
            "total_tokens": stats.prompt_tokens + stats.new_tokens}


def sse(obj) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


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
        self.pieces = TokenPieces(gateway.tokenizer)
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
            pieces = self.pieces.split(step.token_ids, step.round.origins, step.text)
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


async def _until_disconnect(receive, coro):
    """Runs ``coro``; cancels it when the client disconnects. Returns its result, or None if cancelled."""
    task = asyncio.ensure_future(coro)

    async def watch():
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                task.cancel()
                return

    watcher = asyncio.ensure_future(watch())
    try:
        return await task
    except asyncio.CancelledError:
        if task.cancelled() and not watcher.done():
            raise                       # we ourselves are being cancelled
        if watcher.done():
            return None                 # the client went away
        raise
    finally:
        watcher.cancel()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


class EventStream(Response):
    """Server-sent events from an async iterator of bytes; the iterator is closed (so the generation is
    cancelled and its sessions freed) as soon as the client disconnects, not when the GC gets to it."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], on_close):
        self.status_code, self.background = 200, None
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8"),
                            *((k.encode(), v.encode()) for k, v in SSE_HEADERS.items())]
        self.events, self.on_close = events, on_close

    async def __call__(self, scope, receive, send):
        async def pump():
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for chunk in self.events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            with contextlib.suppress(OSError):          # a send after the client left
                await _until_disconnect(receive, pump())
        finally:
            with contextlib.suppress(Exception):
                await self.events.aclose()
            await self.on_close()


# ---- the app -----------------------------------------------------------------------------------
class HttpApi:
    def __init__(self, gateway: Gateway, token: str | None, model_name: str):
        self.gateway, self.token, self.model_name = gateway, token or None, model_name or gateway.target.model_name
        self.created = int(time.time())

    # -- helpers --
    def check_auth(self, request: Request) -> None:
        if not self.token:
            return
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not value:
            raise ApiError(401, "Missing bearer token: send 'Authorization: Bearer <token>' (the gateway's --token)",
                           code="invalid_api_key")
        if not bearer_matches(header, self.token):
            raise ApiError(401, "Incorrect API key provided (the gateway's --token)", code="invalid_api_key")

    def check_model(self, model: str | None) -> None:
        if model and model not in (self.model_name, self.gateway.target.model_name):
            raise ApiError(404, f"The model '{model}' does not exist: this gateway serves '{self.model_name}'",
                           param="model", code="model_not_found")

    async def body(self, request: Request):
        try:
            return json.loads(await request.body() or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from exc

    def params(self, parsed: Parsed) -> GenerateParams:
        if parsed.chat:
            tok = self.gateway.tokenizer
            if not tok.chat_template:
                raise ApiError(400, "the target model has no chat template: use /v1/completions",
                               param="messages", code="no_chat_template")
            try:
                text = tok.apply_chat_template(parsed.messages, add_generation_prompt=True, tokenize=False)
            except Exception as exc:  # noqa: BLE001 - a template may refuse a conversation (roles, order)
                raise ApiError(400, f"the chat template refused the messages: {exc}", param="messages") from exc
            prompt_ids = tuple(tok(text, add_special_tokens=False)["input_ids"])
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
                              ignore_eos=parsed.ignore_eos, draft_confidence=parsed.draft_confidence)

    # -- endpoints --
    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def _generate(self, request: Request, chat: bool) -> Response:
        try:
            self.check_auth(request)
            body = await self.body(request)
            parsed = parse_chat(body) if chat else parse_completion(body)
            self.check_model(parsed.model)
            gen = Generation(self.gateway, parsed, self.params(parsed))
            started = await _until_disconnect(request.receive, self._start(gen))
            if started is None:
                await gen.close()
                return Response(status_code=499)     # nobody is listening any more
        except Exception as exc:
            err = error_from_exception(exc)
            if err is None:
                log.exception("HTTP API: unexpected error")
                err = ApiError(500, f"internal error: {exc!r}", type="server_error", code="internal_error")
            return error_response(err)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        if parsed.stream:
            return EventStream(self._stream(gen, rid, created, chat), gen.close)
        try:
            reply = await _until_disconnect(request.receive, self._collect(gen, rid, created, chat))
        except Exception as exc:
            err = error_from_exception(exc) or ApiError(500, f"internal error: {exc!r}", type="server_error",
                                                        code="internal_error")
            return error_response(err)
        finally:
            await gen.close()
        return JSONResponse(reply) if reply is not None else Response(status_code=499)

    async def _start(self, gen: Generation) -> bool:
        await gen.start()
        return True

    async def _collect(self, gen: Generation, rid: str, created: int, chat: bool) -> dict:
        text = "".join([d.text async for d in gen.deltas()])
        if gen.parsed.echo and not chat:
            text = (gen.parsed.prompt or self.gateway.tokenizer.decode(list(gen.parsed.prompt_ids))) + text
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
                yield chunk(gen.parsed.prompt or self.gateway.tokenizer.decode(list(gen.parsed.prompt_ids)))
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
            err = error_from_exception(exc) or ApiError(500, f"internal error: {exc!r}", type="server_error",
                                                        code="internal_error")
            yield sse(err.body())
        finally:
            await gen.close()
        yield b"data: [DONE]\n\n"

    async def models(self, request: Request) -> Response:
        try:
            self.check_auth(request)
        except ApiError as err:
            return error_response(err)
        target = self.gateway.target
        return JSONResponse({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self.created, "owned_by": "tandem",
            "tandem": {"target_model": target.model_name, "draft_model": self.gateway.drafter_name,
                       "max_context": target.max_context, "auth": bool(self.token)}}]})

    async def health(self, request: Request) -> Response:
        ok, detail = await verifier_reachable(self.gateway)
        body = {"status": "ok" if ok else "unavailable", "verifier": detail, "model": self.model_name,
                "target_model": self.gateway.target.model_name, "draft_model": self.gateway.drafter_name,
                "drafter": ("none" if self.gateway.drafter is None else
                            "up" if self.gateway.drafter_healthy else "down"),
                "auth": bool(self.token)}
        return JSONResponse(body, status_code=200 if ok else 503)

    async def index(self, request: Request) -> Response:
        return FileResponse(STATIC_DIR / "index.html", headers={"cache-control": "no-cache"})


async def verifier_reachable(gateway: Gateway, timeout_s: float = 2.0) -> tuple[bool, str]:
    """Asks the verifier's gRPC health service (open without the token) over the gateway's channel."""
    channel = getattr(gateway.verifier, "channel", None)
    if channel is None:                 # an in-process verifier: reachable by construction
        return True, "SERVING"
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    try:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                                timeout=timeout_s)
    except grpc.aio.AioRpcError as err:
        return False, f"{err.code().name}: {err.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return status == "SERVING", status


def build_app(gateway: Gateway, *, token: str | None, model_name: str) -> Starlette:
    """The ASGI app: the OpenAI-compatible API and the chat page over ``gateway``."""
    api = HttpApi(gateway, token, model_name)
    routes = [
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/", api.index, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ]

    async def not_found(request, exc):
        status = getattr(exc, "status_code", 404)
        return error_response(ApiError(status, f"{request.method} {request.url.path}: "
                                       f"{'not found' if status == 404 else getattr(exc, 'detail', 'error')}",
                                       code="not_found" if status == 404 else None))

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
    app.state.api = api
    return app


# ---- serving -----------------------------------------------------------------------------------
@dataclass
class HttpHandle:
    server: object
    task: asyncio.Task
    host: str
    port: int
    tls: bool

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stops accepting, lets running requests finish for ``grace_s``, then closes what is left."""
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self.task), grace_s)
        except (TimeoutError, asyncio.TimeoutError):
            self.server.force_exit = True
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self.task, 5.0)


async def serve_http(app, host: str = "127.0.0.1", port: int = 0, ssl_certfile: str | None = None,
                     ssl_keyfile: str | None = None, log_level: str = "warning") -> HttpHandle:
    """Serves ``app`` with uvicorn on the running event loop (port 0: a free one); returns once it listens.
    uvicorn's signal handlers are not installed: the gateway's own start-up handles SIGINT/SIGTERM."""
    import uvicorn

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            yield

        def install_signal_handlers(self) -> None:      # older uvicorn
            pass

    if bool(ssl_certfile) != bool(ssl_keyfile):
        raise ValueError("HTTPS needs both a certificate and a key")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.setblocking(False)
    config = uvicorn.Config(app, log_level=log_level, lifespan="off", ssl_certfile=ssl_certfile,
                            ssl_keyfile=ssl_keyfile, timeout_graceful_shutdown=5, access_log=False,
                            http="h11", ws="none")
    server = _Server(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            sock.close()
            task.result()               # raises the start-up error
            raise RuntimeError(f"the HTTP server on {host}:{port} stopped while starting")
        await asyncio.sleep(0.01)
    bound_port = sock.getsockname()[1]
    return HttpHandle(server, task, host, bound_port, bool(ssl_certfile))
