"""The domain errors that cross the wire. Each maps to exactly one gRPC status code, once, in
``tandem.serving`` (``STATUS_OF``); clients decide on the code, never on the message or a class name.

    InvalidInput       bad request field (ids outside the vocabulary, q that is not a distribution)  -> INVALID_ARGUMENT
    UnknownSession     no such session: never started, ended, evicted, or knows fewer tokens          -> NOT_FOUND
    SessionExists      StartSession on an id that is already open                                    -> ALREADY_EXISTS
    NotSessionOwner    the call does not carry the session's secret                                   -> PERMISSION_DENIED
    CapacityExceeded   a node limit (sessions, block size) is reached                                 -> RESOURCE_EXHAUSTED

Plain Python: no grpc here (math and model code raise these).
"""

from __future__ import annotations


class TandemError(Exception):
    """Base of the errors a servicer turns into a status code; ``str()`` is the message the caller sees."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else self.__class__.__doc__.strip().split("\n")[0]


class InvalidInput(TandemError, ValueError):
    """The request is malformed or out of range."""


class UnknownSession(TandemError, KeyError):
    """Unknown session (never started, already ended, or evicted after being idle)."""


class SessionExists(TandemError):
    """A session with this id is already open."""


class NotSessionOwner(TandemError):
    """The call does not prove it owns the session."""


class CapacityExceeded(TandemError, RuntimeError):
    """A node's limit is reached (sessions held at once, draft block size)."""
