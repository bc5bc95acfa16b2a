"""The domain errors that cross the wire, and the one table (``WIRE``) saying how each crosses it: its gRPC
status (``tandem.serving`` turns the name into a ``grpc.StatusCode``), its HTTP status and its OpenAI error
type and code (the gateway's HTTP API). Clients decide on the status code, never on the message or a class
name; the message is for people, the ``param`` of an InvalidInput names the request field.

    error               what happened                                          gRPC                HTTP
    InvalidInput        a request field is malformed or out of range           INVALID_ARGUMENT    400
    UnknownSession      no such session: never started, ended, evicted         NOT_FOUND           502
    SessionExists       StartSession on an id that is already open             ALREADY_EXISTS      502
    NotSessionOwner     the call does not carry the session's secret           PERMISSION_DENIED   502
    CapacityExceeded    a node limit (sessions, requests at once) is reached   RESOURCE_EXHAUSTED  429
    IncompatibleDrafter drafter and target do not share a vocabulary           FAILED_PRECONDITION 400
    Unavailable         a node the request needs cannot be reached in time     UNAVAILABLE         503
    PeerFailed          a node the request needs failed in another way         INTERNAL            502
    (anything else)     a bug: the text goes to the log, the caller gets a     INTERNAL            500
                        request id to quote

Sessions live between the gateway and its nodes, so an HTTP client meets the session errors only as the
gateway's upstream failing (502). A plain ValueError raised by domain code is bad input (InvalidInput's row).

Plain Python: no grpc here (math and model code raise these).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass


class TandemError(Exception):
    """Base of the errors that cross the wire as a status code; ``str()`` is the message the caller sees."""

    param: str | None = None        # the request field the error is about (OpenAI's ``param``), if one

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else self.__class__.__doc__.strip().split("\n")[0]


class InvalidInput(TandemError, ValueError):
    """The request is malformed or out of range."""

    def __init__(self, message: str = "", param: str | None = None):
        super().__init__(*((message,) if message else ()))
        self.param = param


class UnknownSession(TandemError, KeyError):
    """Unknown session (never started, already ended, or evicted after being idle)."""


class SessionExists(TandemError):
    """A session with this id is already open."""


class NotSessionOwner(TandemError):
    """The call does not prove it owns the session."""


class CapacityExceeded(TandemError, RuntimeError):
    """A node's limit is reached (sessions held at once, draft block size)."""


class Overloaded(CapacityExceeded):
    """The gateway already serves --max-concurrent-requests requests: refused at once, never queued."""


class IncompatibleDrafter(TandemError):
    """Drafter and target do not share a vocabulary: speculation is refused."""

    param = "speculation"


class Unavailable(TandemError):
    """A node the request needs cannot be reached (down, or no answer within the deadline)."""


class PeerFailed(TandemError):
    """A node the request needs answered with an error that is not the request's fault."""


@dataclass(frozen=True)
class Wire:
    """How an error crosses the wire: gRPC status name, HTTP status, OpenAI error type and code."""

    grpc: str
    http: int
    type: str
    code: str


WIRE: dict[type, Wire] = {
    InvalidInput: Wire("INVALID_ARGUMENT", 400, "invalid_request_error", "invalid_value"),
    UnknownSession: Wire("NOT_FOUND", 502, "server_error", "upstream_session_lost"),
    SessionExists: Wire("ALREADY_EXISTS", 502, "server_error", "upstream_error"),
    NotSessionOwner: Wire("PERMISSION_DENIED", 502, "server_error", "upstream_error"),
    CapacityExceeded: Wire("RESOURCE_EXHAUSTED", 429, "requests", "rate_limit_exceeded"),
    IncompatibleDrafter: Wire("FAILED_PRECONDITION", 400, "invalid_request_error", "incompatible_drafter"),
    Unavailable: Wire("UNAVAILABLE", 503, "server_error", "upstream_unavailable"),
    PeerFailed: Wire("INTERNAL", 502, "server_error", "upstream_error"),
}
UNEXPECTED = Wire("INTERNAL", 500, "server_error", "internal_error")


def wire_of(exc: BaseException) -> Wire | None:
    """The row of ``exc`` (its nearest class in WIRE; a plain ValueError is bad input); None: not a domain
    error, i.e. a bug (UNEXPECTED)."""
    for cls in type(exc).__mro__:
        if cls in WIRE:
            return WIRE[cls]
    if isinstance(exc, ValueError):
        return WIRE[InvalidInput]
    return None


# A peer's status, read back (gateway.clients): the class whose row has it; a deadline is the peer not
# answering in time; any other status is the peer failing.
_BY_STATUS = {w.grpc: cls for cls, w in WIRE.items() if cls not in (IncompatibleDrafter, PeerFailed)}
_BY_STATUS["DEADLINE_EXCEEDED"] = Unavailable


def error_for_status(status: str, message: str) -> TandemError:
    """The domain error a peer's gRPC status ``status`` (its name, e.g. "NOT_FOUND") stands for."""
    return _BY_STATUS.get(status, PeerFailed)(message)


def log_bug(log, where: str, exc: BaseException) -> str:
    """Logs ``exc`` (not a domain error: a bug) with its traceback under a new request id and returns the id,
    the one thing its caller is told (the text may hold internals)."""
    request_id = uuid.uuid4().hex[:16]
    log.error("%s: internal error, request id %s", where, request_id, exc_info=exc)
    return request_id
