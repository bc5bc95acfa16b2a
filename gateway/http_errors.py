"""The HTTP API's errors in OpenAI's shape {"error": {"message", "type", "param", "code"}}, as responses.

A domain error (``tandem.errors``) crosses by the one table ``tandem.errors.WIRE`` (HTTP status, type,
code), its ``param`` renamed to the request's field; an ``ApiError`` (``gateway.openai_schema``) is the
HTTP side's own and goes out as it is; anything else is a bug: 500 with a request id, the details logged.
"""

from __future__ import annotations

import logging

from starlette.responses import JSONResponse

from gateway.openai_schema import ApiError
from tandem.errors import log_bug, wire_of

log = logging.getLogger(__name__)

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
    request_id = log_bug(log, "HTTP API", exc)
    return ApiError(500, f"internal error (request id {request_id}; the details are in the gateway's log)",
                    type="server_error", code="internal_error")


def client_error(exc: BaseException, chat: bool = False) -> ApiError:
    """What the client is told about ``exc``: its domain error, else a 500 with a request id."""
    return error_from_exception(exc, chat) or internal_error(exc)


def error_response(err: ApiError, headers: dict | None = None) -> JSONResponse:
    """``err`` as a JSON response (a 401 says which scheme to use: Bearer)."""
    headers = dict(headers or {})
    if err.status == 401:
        headers["www-authenticate"] = "Bearer"
    return JSONResponse(err.body(), status_code=err.status, headers=headers or None)
