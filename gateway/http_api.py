"""The OpenAI-compatible HTTP API of the gateway and its chat page, over the same engine as the gRPC API.

    app = build_app(gateway, token=security.token, model_name="tandem")
    handle = await serve_http(app, "127.0.0.1", 8000)         # in the gateway's own event loop
    ...
    await handle.stop()

Endpoints: POST /v1/chat/completions, POST /v1/completions (both with ``stream: true`` as server-sent
events ending in ``data: [DONE]``), GET /v1/models, GET /health (200 when the verifier answers, else 503),
and the chat page at / (static files in gateway/static/). One model is served: a request may name it by
any name (the served name, "tandem", or another: as llama-server, the field is not checked).

Extensions: ``top_k``; ``ignore_eos``; ``no_speculation`` or ``"tandem": {"speculation": false,
"draft_length": k, "draft_confidence": c}``. Replies carry ``usage`` and a ``tandem`` object with the
speculation statistics; stream chunks carry ``tandem.tokens`` = [{"text", "origin": draft|lookup|target}].

Errors have OpenAI's shape {"error": {"message", "type", "param", "code"}}: the engine's and the nodes'
errors by the one table of ``tandem.errors`` (400 bad input naming its ``param``, 429 over
--max-concurrent-requests, 503 verifier unreachable, 502 other upstream failures, 500 with a request id
for a bug), and the HTTP side's own: 401 without the bearer token when one is configured, 403 a foreign
Host or Origin, 413 a body over --max-request-bytes.

What a web page or a slow client cannot do (``BrowserGuard`` and ``serve_http``): reach the API through a
name the gateway does not answer to (DNS rebinding: Host must be an IP address, localhost, this machine's
name, the bound address, or in --allowed-hosts), send a request from another site (Origin absent,
same-origin, or in --allowed-origins; CORS preflights are answered for those only), send a body over
--max-request-bytes (refused by Content-Length, or as soon as the count passes it), take longer than
--http-read-timeout to send a request's head and body, or hold more than --http-max-connections
connections. JSON parsing, chat templating and tokenizing run on the gateway's tokenizing threads, never
on the event loop that serves every other client.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from gateway.engine import Gateway, GenerateParams
from gateway.openai_schema import ApiError, Parsed, PieceCutter, parse_chat, parse_completion
from gateway.stats import RequestStats
from tandem.errors import wire_of
from tandem.security import bearer_matches

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
DEFAULT_READ_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 256


# ---- errors ------------------------------------------------------------------------------------
# The engine's field names -> the OpenAI request's (the prompt of a chat request is its messages).
_HTTP_PARAM = {"draft_length": "tandem.draft_length", "draft_confidence": "tandem.draft_confidence",
               "speculation": "tandem.speculation", "chat": "messages"}


def error_from_exception(exc: BaseException, chat: bool = False) -> ApiError | None:
    """The client's error for a domain exception (``tandem.errors.WIRE``: status, type, code; the param in
    the request's terms); None for anything else (a bug: ``internal_error``)."""
    if isinstance(exc, ApiError):
        return exc
    wire = wire_of(exc)
    if wire is None:
        return None
    param = getattr(exc, "param", None)
    param = "messages" if chat and param == "prompt" else _HTTP_PARAM.get(param, param)
    return ApiError(wire.http, str(exc), type=wire.type, code=wire.code, param=param)


def internal_error(exc: BaseException) -> ApiError:
    """A 500 for a bug: the exception is logged under a request id; the client gets the id, not the text."""
    request_id = uuid.uuid4().hex[:16]
    log.error("HTTP API: internal error, request id %s", request_id, exc_info=exc)
    return ApiError(500, f"internal error (request id {request_id}; the details are in the gateway's log)",
                    type="server_error", code="internal_error")


def client_error(exc: BaseException, chat: bool = False) -> ApiError:
    return error_from_exception(exc, chat) or internal_error(exc)


def error_response(err: ApiError, headers: dict | None = None) -> JSONResponse:
    headers = dict(headers or {})
    if err.status == 401:
        headers["www-authenticate"] = "Bearer"
    return JSONResponse(err.body(), status_code=err.status, headers=headers or None)


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

    def prepare(self, raw: bytes, chat: bool) -> tuple[Parsed, GenerateParams]:
        """The request body -> the engine's parameters: JSON, the OpenAI fields, a chat's template and tokens
        (blocking work: runs on the gateway's tokenizing threads)."""
        try:
            body = json.loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from exc
        parsed = parse_chat(body) if chat else parse_completion(body)
        return parsed, self.params(parsed)

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
            parsed, params = await self.gateway.off_loop(self.prepare, await request.body(), chat)
            gen = Generation(self.gateway, parsed, params)
            started = await _until_disconnect(request.receive, self._start(gen))
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
            reply = await _until_disconnect(request.receive, self._collect(gen, rid, created, chat))
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
            yield sse(client_error(exc, chat).body())
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

    async def favicon(self, request: Request) -> Response:
        """The page's icon (index.html links it; this answers clients that ask at the usual path)."""
        return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml")


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


# ---- what a web page, a slow client or a big body cannot do ---------------------------------------
def _host_name(host_header: str) -> str:
    """The name in a Host header, without the port or IPv6 brackets, lower case."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    name, _, port = host.rpartition(":")
    return (name if name and port.isdigit() else host).rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class BrowserGuard:
    """ASGI middleware in front of every route (pure ASGI: no buffering beyond the request body's cap).

    - Host: an IP address (a page cannot rebind an address), ``localhost`` and ``*.localhost``, this machine's
      name, the bound address, or one of ``allowed_hosts`` (a leading dot matches a domain's names; ``*``: any).
      Anything else is 403: a page on a name that resolves to this machine (DNS rebinding) cannot reach it.
    - Origin (sent by browsers): absent (not a page: curl, SDKs), the request's own origin (the chat page), or
      one of ``allowed_origins`` (``*``: any site). Anything else is 403, also for "simple" requests a browser
      sends without asking first (a text/plain POST). CORS preflights are answered for allowed origins only,
      and their requests' replies carry Access-Control-Allow-Origin.
    - Body: Content-Length over ``max_body_bytes`` is 413 before a byte of it is read; a body without one is
      counted as it arrives and refused as soon as it passes the cap.
    """

    def __init__(self, app, *, allowed_hosts: Iterable[str] = (), allowed_origins: Iterable[str] = (),
                 bound_host: str = "127.0.0.1", max_body_bytes: int = 2 << 20):
        self.app = app
        hosts = {h.strip().lower().strip("[]") for h in allowed_hosts if h.strip()}
        self.any_host = "*" in hosts
        self.host_suffixes = tuple(h for h in hosts if h.startswith("."))
        here = {bound_host.strip().strip("[]").lower(), socket.gethostname().lower(), socket.getfqdn().lower()}
        self.hosts = hosts | here | {"localhost"}
        origins = {o.strip().rstrip("/").lower() for o in allowed_origins if o.strip()}
        self.any_origin, self.origins = "*" in origins, origins
        self.max_body_bytes = max_body_bytes

    def host_allowed(self, host_header: str) -> bool:
        name = _host_name(host_header)
        return (self.any_host or not name or name in self.hosts or name.endswith(".localhost") or _is_ip(name)
                or name.endswith(self.host_suffixes))

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if not self.host_allowed(host):
            await self.refuse(scope, receive, send, ApiError(
                403, f"Host {_host_name(host)!r} is not a name this gateway answers to (a page on another site "
                "may have pointed that name at it): add it to --allowed-hosts (TANDEM_ALLOWED_HOSTS), '*' for any",
                code="host_not_allowed"))
            return
        origin = headers.get("origin")
        cross = origin is not None and origin.rstrip("/").lower() != f"{scope['scheme']}://{host}".lower()
        if cross and not (self.any_origin or origin.rstrip("/").lower() in self.origins):
            await self.refuse(scope, receive, send, ApiError(
                403, f"Origin {origin!r} may not use this API (a web page on another site): add it to "
                "--allowed-origins (TANDEM_ALLOWED_ORIGINS), '*' for any site", code="origin_not_allowed"))
            return
        cors = {"access-control-allow-origin": origin, "vary": "origin"} if cross else {}
        if scope["method"] == "OPTIONS" and origin is not None and "access-control-request-method" in headers:
            await Response(status_code=204, headers={
                **cors, "access-control-allow-methods": "GET, POST, OPTIONS", "access-control-max-age": "600",
                "access-control-allow-headers": headers.get("access-control-request-headers",
                                                            "authorization, content-type")})(scope, receive, send)
            return
        if cors:
            send = _with_headers(send, cors)
        if scope["method"] in ("POST", "PUT", "PATCH"):
            receive = await self.read_body(scope, receive, send, headers)
            if receive is None:
                return
        await self.app(scope, receive, send)

    async def read_body(self, scope, receive, send, headers: Headers):
        """The body read whole, within the cap, as a ``receive`` that replays it (then waits for the client
        to leave, for the app's disconnect watch); None once refused or the client is gone."""
        length = headers.get("content-length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_body_bytes:
            await self.refuse(scope, receive, send, self._too_large(int(length)))
            return None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                await self.refuse(scope, receive, send, self._too_large(size, counted=True))
                return None
            if not message.get("more_body", False):
                break
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replaying():
            return replay.pop() if replay else await receive()
        return replaying

    def _too_large(self, size: int, counted: bool = False) -> ApiError:
        return ApiError(413, f"the request body is {'over ' if counted else ''}{size} bytes, more than the gateway's "
                        f"--max-request-bytes ({self.max_body_bytes})", code="request_too_large")

    @staticmethod
    async def refuse(scope, receive, send, err: ApiError) -> None:
        """The error, and the connection closed after it (what is left of the request is not read)."""
        await error_response(err, {"connection": "close"})(scope, receive, send)


def _with_headers(send, extra: dict):
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]

    async def sending(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *raw]}
        await send(message)
    return sending


def build_app(gateway: Gateway, *, token: str | None, model_name: str, allowed_hosts: Iterable[str] = (),
              allowed_origins: Iterable[str] = (), bound_host: str = "127.0.0.1",
              max_body_bytes: int | None = None) -> Starlette:
    """The ASGI app: the OpenAI-compatible API and the chat page over ``gateway``, behind ``BrowserGuard``
    (``max_body_bytes`` default: the gateway's --max-request-bytes)."""
    from starlette.middleware import Middleware

    api = HttpApi(gateway, token, model_name)
    routes = [
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/", api.index, methods=["GET"]),
        Route("/favicon.ico", api.favicon, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ]

    async def not_found(request, exc):
        status = getattr(exc, "status_code", 404)
        return error_response(ApiError(status, f"{request.method} {request.url.path}: "
                                       f"{'not found' if status == 404 else getattr(exc, 'detail', 'error')}",
                                       code="not_found" if status == 404 else None))

    if max_body_bytes is None:
        max_body_bytes = gateway.config.max_request_bytes
    guard = Middleware(BrowserGuard, allowed_hosts=tuple(allowed_hosts), allowed_origins=tuple(allowed_origins),
                       bound_host=bound_host, max_body_bytes=max_body_bytes)
    app = Starlette(routes=routes, middleware=[guard], exception_handlers={404: not_found, 405: not_found})
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


def _bounded_protocol(read_timeout_s: float, max_connections: int):
    """uvicorn's HTTP/1.1 protocol with two bounds uvicorn lacks: at most ``max_connections`` connections
    open at once (one more is closed as soon as it is accepted), and a request's head and body must arrive
    within ``read_timeout_s`` of the connection being ready for it (a client trickling bytes is answered 408
    and dropped; the response's own time is not bounded)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    waiting = (h11.IDLE, h11.SEND_BODY)       # the client's side of a request not yet fully received

    class BoundedH11Protocol(H11Protocol):
        read_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.close()
                return
            self._expect_request()

        def _expect_request(self) -> None:
            self._stop_read_timer()
            self.read_timer = self.loop.call_later(read_timeout_s, self._read_timed_out)

        def _stop_read_timer(self) -> None:
            if self.read_timer is not None:
                self.read_timer.cancel()
                self.read_timer = None

        def handle_events(self) -> None:
            super().handle_events()
            if self.conn.their_state not in waiting:
                self._stop_read_timer()         # the request is in (or the connection is done)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state in waiting:
                self._expect_request()          # keep-alive: the next request has the same time to arrive

        def connection_lost(self, exc) -> None:
            self._stop_read_timer()
            super().connection_lost(exc)

        def _read_timed_out(self) -> None:
            self.read_timer = None
            if self.transport.is_closing() or self.conn.their_state not in waiting:
                return
            cycle = self.cycle
            if cycle is not None and not cycle.response_started and self.conn.our_state is h11.SEND_RESPONSE:
                cycle.disconnected = True       # the app sees the client gone and sends nothing more
                cycle.message_event.set()
                body = json.dumps(ApiError(408, f"the request did not arrive within {read_timeout_s:g} s "
                                           "(--http-read-timeout)", code="request_timeout").body()).encode()
                with contextlib.suppress(h11.LocalProtocolError):
                    self.transport.write(self.conn.send(h11.Response(status_code=408, headers=[
                        (b"content-type", b"application/json"), (b"connection", b"close"),
                        (b"content-length", str(len(body)).encode())])) + self.conn.send(h11.Data(data=body))
                        + self.conn.send(h11.EndOfMessage()))
            self.transport.close()

    return BoundedH11Protocol


async def serve_http(app, host: str = "127.0.0.1", port: int = 0, ssl_certfile: str | None = None,
                     ssl_keyfile: str | None = None, log_level: str = "warning",
                     read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
                     max_connections: int = DEFAULT_MAX_CONNECTIONS) -> HttpHandle:
    """Serves ``app`` with uvicorn on the running event loop (port 0: a free one); returns once it listens.
    uvicorn's signal handlers are not installed: the gateway's own start-up handles SIGINT/SIGTERM.
    ``read_timeout_s`` and ``max_connections``: see ``_bounded_protocol``; request heads are limited to
    h11's 16 KiB, idle keep-alive connections close after 5 s."""
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
                            http=_bounded_protocol(read_timeout_s, max_connections), ws="none",
                            timeout_keep_alive=5, h11_max_incomplete_event_size=16 * 1024)
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
