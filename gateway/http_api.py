"""The OpenAI-compatible HTTP API of the gateway and its chat page, over the same engine as the gRPC API:
the app, its routes, and the endpoints that do not generate.

    app = build_app(gateway, token=security.token, model_name="tandem")
    handle = await serve_http(app, "127.0.0.1", 8000)         # gateway.http_server, in the gateway's loop
    ...
    await handle.stop()

Endpoints: POST /v1/chat/completions, POST /v1/completions (``gateway.http_completions``; both with
``stream: true`` as server-sent events ending in ``data: [DONE]``), GET /v1/models and /v1/models/{id},
GET /health (200 when the verifier answers, else 503), and the chat page at / (static files in gateway/static/). One model is
served: a request may name it by any name (the served name, "tandem", or another: as llama-server, the
field is not checked).

Extensions: ``top_k``; ``ignore_eos``; ``cache_salt`` (vLLM's: the verifier's prefix cache is shared only
among requests of the same salt); ``no_speculation`` or ``"tandem": {"speculation": false,
"draft_length": k, "draft_confidence": c}``. Replies carry ``usage`` and a ``tandem`` object with the
speculation statistics; stream chunks carry ``tandem.tokens`` = [{"text", "origin": draft|lookup|target}].

Errors have OpenAI's shape {"error": {"message", "type", "param", "code"}} (``gateway.http_errors``): the
engine's and the nodes' errors by the one table of ``tandem.errors`` (400 bad input naming its ``param``,
429 over --max-concurrent-requests, 503 verifier unreachable, 502 other upstream failures, 500 with a
request id for a bug), and the HTTP side's own: 401 without the bearer token when one is configured, 403 a
foreign Host or Origin, 413 a body over --max-request-bytes (``gateway.http_guard``), 408 a request that
does not arrive within --http-read-timeout (``gateway.http_server``). JSON parsing, chat templating and
tokenizing run on the gateway's tokenizing threads, never on the event loop that serves every other client.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import grpc
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from gateway.engine import Gateway
from gateway.http_completions import Completions
from gateway.http_errors import error_response
from gateway.http_guard import BrowserGuard, require_token
from gateway.openai_schema import ApiError

STATIC_DIR = Path(__file__).resolve().parent / "static"


class HttpApi:
    """The endpoints that do not generate: the model list, health, the chat page and its icon."""

    def __init__(self, gateway: Gateway, token: str | None, model_name: str):
        self.gateway, self.token, self.model_name = gateway, token or None, model_name or gateway.target.model_name
        self.created = int(time.time())

    def _model(self) -> dict:
        target = self.gateway.target
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "tandem",
                "tandem": {"target_model": target.model_name, "draft_model": self.gateway.drafter_name,
                           "max_context": target.max_context, "auth": bool(self.token)}}

    async def models(self, request: Request) -> Response:
        try:
            require_token(request, self.token)
        except ApiError as err:
            return error_response(err)
        return JSONResponse({"object": "list", "data": [self._model()]})

    async def model(self, request: Request) -> Response:
        """GET /v1/models/{id} (the OpenAI clients' ``models.retrieve``): the served model under its served
        name, the target's own name, "tandem" or "default"; another id is a 404 that names the served one."""
        try:
            require_token(request, self.token)
            wanted = request.path_params["model_id"]
            if wanted not in (self.model_name, self.gateway.target.model_name, "tandem", "default"):
                raise ApiError(404, f"the model {wanted!r} does not exist here: this server serves one model, "
                                    f"{self.model_name!r} (completions accept it under any name)",
                               param="model", code="model_not_found")
        except ApiError as err:
            return error_response(err)
        return JSONResponse(self._model())

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


def build_app(gateway: Gateway, *, token: str | None, model_name: str, allowed_hosts: Iterable[str] = (),
              allowed_origins: Iterable[str] = (), bound_host: str = "127.0.0.1",
              max_body_bytes: int | None = None) -> Starlette:
    """The ASGI app: the OpenAI-compatible API and the chat page over ``gateway``, behind ``BrowserGuard``
    (``max_body_bytes`` default: the gateway's --max-request-bytes)."""
    from starlette.middleware import Middleware

    api = HttpApi(gateway, token, model_name)
    completions = Completions(gateway, api.token, api.model_name)
    routes = [
        Route("/v1/chat/completions", completions.chat_completions, methods=["POST"]),
        Route("/v1/completions", completions.completions, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", api.model, methods=["GET"]),
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
