"""What a caller must pass before the HTTP API does any work: the bearer token, and what a web page or a big
body cannot do (``BrowserGuard``, ASGI middleware in front of every route).

A web page cannot reach the API through a name the gateway does not answer to (DNS rebinding: Host must be
an IP address, localhost, this machine's name, the bound address, or in --allowed-hosts), nor send a request
from another site (Origin absent, same-origin, or in --allowed-origins; CORS preflights are answered for
those only). A body over --max-request-bytes is refused by its Content-Length, or as soon as the count
passes it. Without the token (when one is configured) the API's routes answer 401 (``require_token``).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response

from gateway.http_errors import error_response
from gateway.openai_schema import ApiError
from tandem.security import bearer_matches


def require_token(request: Request, token: str | None) -> None:
    """Raises a 401 ``ApiError`` unless the request carries ``Authorization: Bearer <token>`` (no token: open)."""
    if not token:
        return
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value:
        raise ApiError(401, "Missing bearer token: send 'Authorization: Bearer <token>' (the gateway's --token)",
                       code="invalid_api_key")
    if not bearer_matches(header, token):
        raise ApiError(401, "Incorrect API key provided (the gateway's --token)", code="invalid_api_key")


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

