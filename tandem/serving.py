"""Running a gRPC service: an aio server with health checking, reflection, explicit message-size
limits, keepalive, and a graceful stop on SIGINT/SIGTERM (in-flight calls get a grace period).

Every RPC registered with ``add_servicer`` answers a domain error (``tandem.errors``) with its status code
and message, and anything else (a bug) with INTERNAL and a request id: the exception goes to the log,
never to the caller."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tandem.errors import log_bug, wire_of
from tandem.flags import write_port_file
from tandem.sessions import CALLER

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024   # tokenizer JSON travels in GetInfo (a few MB)
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # A port belongs to one server: without this, gRPC sets SO_REUSEPORT and a second `tandem up` on a
    # port in use "starts" beside the first.
    ("grpc.so_reuseport", 0),
]
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # A peer that was down (a drafter switched off) is retried within seconds once it is back,
    # not after gRPC's default backoff of up to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 5_000),
]


def status_of(exc: BaseException) -> grpc.StatusCode | None:
    """The status code of a domain exception (tandem.errors.WIRE; a plain ValueError is INVALID_ARGUMENT);
    None: not a domain error."""
    wire = wire_of(exc)
    return None if wire is None else getattr(grpc.StatusCode, wire.grpc)


async def abort_with(context: grpc.aio.ServicerContext, exc: Exception, where: str) -> None:
    """Ends the call for ``exc``: a domain error with its status code and message; anything else with
    INTERNAL and a request id, the exception itself logged under that id (its text may hold internals)."""
    if isinstance(exc, grpc.aio.AbortError):        # the servicer aborted with a status of its own
        raise exc
    code = status_of(exc)
    if code is not None:
        exc.__traceback__ = None        # its frames hold the request: freed now, not at the next garbage collection
        await context.abort(code, str(exc))
    request_id = log_bug(log, where, exc)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {where} (request id {request_id}; the "
                        "details are in that node's log)")


def abort_on_error(method: Callable[..., Awaitable]) -> Callable[..., Awaitable]:
    """Maps exceptions to the call's status as ``abort_with`` does (``add_servicer`` does this for every
    method; servicers registered otherwise use this decorator)."""

    @functools.wraps(method)
    async def wrapper(self, request, context: grpc.aio.ServicerContext):
        try:
            return await method(self, request, context)
        except Exception as exc:
            error = exc
        del request             # see _serve: the abort's traceback must not hold it
        await abort_with(context, error, method.__qualname__)

    return wrapper


class Malformed:
    """What a request that does not parse (bad protobuf, invalid UTF-8 in a string) deserializes to, so the
    servicer can answer INVALID_ARGUMENT instead of grpc's UNKNOWN."""

    def __init__(self, method: str, error: Exception):
        self.method, self.error = method, error


def _lenient(parse: Callable[[bytes], object], method: str) -> Callable[[bytes], object]:
    def deserialize(data: bytes):
        try:
            return parse(data)
        except Exception as exc:      # noqa: BLE001 - DecodeError, UnicodeDecodeError, RuntimeWarning...
            return Malformed(method, exc)
    return deserialize


def _serve(behaviour, method: str, streaming: bool, client_streaming: bool = False):
    """One RPC: a request that does not parse is INVALID_ARGUMENT, the caller's peer is
    ``tandem.sessions.CALLER`` while it runs, and errors end it as ``abort_with`` says."""
    async def refuse(request, context) -> None:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: the request does not parse as "
                                f"protobuf ({type(request.error).__name__}: {request.error})")

    async def guarded(replies, context):
        """The replies, with the caller's peer set while they are made; an error ends the call. Closed early
        (a cancelled call), it closes ``replies`` at once, so the behaviour's own cleanup (sessions, the
        request's slot) runs now, whichever context closes it."""
        caller = CALLER.set(context.peer())
        try:
            async for reply in replies:
                yield reply
            return
        except Exception as exc:
            error = exc
        finally:
            try:
                CALLER.reset(caller)
            except ValueError:        # closed from another context (grpc's cleanup of a cancelled call)
                pass
            await replies.aclose()    # a no-op once they ended or raised
        # grpc keeps the abort's exception with the call's state, in a cycle through the frames it passes:
        # without the request in them, a refused 10 MB request is freed when the call ends, not at the next
        # garbage collection
        del replies
        await abort_with(context, error, method)

    async def single(reply):
        yield await reply

    async def unary(request, context):
        await refuse(request, context)
        replies = single(behaviour(request, context))
        del request
        async with contextlib.aclosing(guarded(replies, context)) as answers:
            async for reply in answers:
                answer = reply
        return answer

    async def stream(request, context):
        await refuse(request, context)
        replies = behaviour(request, context)
        del request
        # closed here when the call ends early (a cancelled stream): the guard's finally must run in this
        # call's context, not later from the garbage collector's
        async with contextlib.aclosing(guarded(replies, context)) as guarded_replies:
            async for reply in guarded_replies:
                yield reply

    async def requests(request_iterator, context):
        async for request in request_iterator:
            await refuse(request, context)
            yield request

    async def bidi(request_iterator, context):
        replies = behaviour(requests(request_iterator, context), context)
        async with contextlib.aclosing(guarded(replies, context)) as guarded_replies:
            async for reply in guarded_replies:
                yield reply

    if client_streaming:
        return bidi
    return stream if streaming else unary


def add_servicer(server: grpc.aio.Server, servicer, service) -> None:
    """Registers ``servicer``'s methods for the protobuf ``service`` descriptor (what the generated
    ``add_*Servicer_to_server`` does), with requests that do not parse answered INVALID_ARGUMENT and errors
    mapped to status codes (``abort_with``)."""
    from google.protobuf import message_factory

    handlers = {}
    for m in service.methods:
        request_cls = message_factory.GetMessageClass(m.input_type)
        reply_cls = message_factory.GetMessageClass(m.output_type)
        make = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
                (True, True): grpc.stream_stream_rpc_method_handler}[(m.client_streaming, m.server_streaming)]
        handlers[m.name] = make(_serve(getattr(servicer, m.name), m.full_name, m.server_streaming, m.client_streaming),
                                request_deserializer=_lenient(request_cls.FromString, m.full_name),
                                response_serializer=reply_cls.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))


class Service:
    """A started aio server. ``port`` is the bound port (useful with port 0)."""

    def __init__(self, server: grpc.aio.Server, port: int, health_servicer: health.aio.HealthServicer | None = None):
        self.server, self.port, self.health = server, port, health_servicer
        self.evictor: asyncio.Task | None = None      # the idle-session sweeper of drafter and verifier

    async def stop(self, grace: float = 5.0) -> None:
        await self.server.stop(grace)
        if self.evictor is not None:
            self.evictor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.evictor


async def start_service(name: str, register: Callable[[grpc.aio.Server], None], service_names: Sequence[str],
                        host: str = "127.0.0.1", port: int = 0, interceptors: Sequence = (),
                        security=None, max_receive_bytes: int | None = None) -> Service:
    """Builds, binds and starts a server; ``register`` adds the servicers to it.

    ``security`` (default: the process's, from the --tls-*/--token flags) gives TLS credentials and the
    token check; plaintext is refused on a non-loopback ``host`` unless it says --insecure.
    ``max_receive_bytes``: the largest request message (gRPC refuses a larger one with RESOURCE_EXHAUSTED
    before it is read; default MAX_MESSAGE_BYTES)."""
    from tandem import security as sec

    security = security or sec.default()
    security.check_listen(host, name)
    credentials = security.server_credentials()
    options = [*SERVER_OPTIONS]
    if max_receive_bytes:
        options = [o for o in options if o[0] != "grpc.max_receive_message_length"]
        options.append(("grpc.max_receive_message_length", int(max_receive_bytes)))
    server = grpc.aio.server(options=options,
                             interceptors=[*security.server_interceptors(), *interceptors])
    register(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError:            # grpc.aio raises "Failed to bind to address ..." itself
        bound = 0
    if bound == 0:
        raise OSError(f"{name}: cannot listen on {address} (port in use?)")
    await server.start()
    for svc in ("", *service_names):
        await health_servicer.set(svc, health_pb2.HealthCheckResponse.SERVING)
    return Service(server, bound, health_servicer)


async def complete_or_undo(work: Awaitable, undo: Callable[[], object], on_cancel: Callable[[], object] | None = None):
    """Awaits ``work`` (a thread that may create a session). If the call is cancelled meanwhile (the client
    went away, its deadline passed), ``on_cancel`` tells the thread (e.g. to stop a prefill at its next chunk),
    the thread still finishes; ``undo`` then frees what it created, so nothing outlives a cancelled call (the
    caller's EndSession may already have come and gone)."""
    future = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if on_cancel is not None:
            on_cancel()
        def _undo(f: asyncio.Future) -> None:
            if not f.cancelled() and f.exception() is None:
                undo()
            elif not f.cancelled():
                f.exception()           # retrieved: a prefill stopped by on_cancel is expected here
        future.add_done_callback(_undo)
        raise


async def run_until_signalled(service: Service, name: str, grace: float = 5.0, port_file: str | None = None,
                              on_stop: Callable[[], Awaitable[None]] | None = None) -> None:
    """Announces the port, waits for SIGINT/SIGTERM, then stops gracefully."""
    print(f"[tandem] {name} listening on port {service.port}", file=sys.stderr, flush=True)
    if port_file:
        write_port_file(port_file, service.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print(f"[tandem] {name} stopping (grace {grace:.0f}s)", file=sys.stderr, flush=True)
    if service.health is not None:
        await service.health.enter_graceful_shutdown()
    if on_stop is not None:
        await on_stop()
    await service.stop(grace)


async def serve_until_stopped(service: Service, name: str, args, tracing,
                              on_stop: Callable[[], Awaitable[None]] | None = None) -> int:
    """Serves metrics (if --metrics-port), runs until SIGINT/SIGTERM, stops gracefully (``on_stop`` first),
    flushes traces."""
    from tandem import metrics

    metrics.serve(service.metrics, args.metrics_port, args.host)
    try:
        await run_until_signalled(service, name, args.grace, args.port_file, on_stop)
    finally:
        tracing.shutdown()
    return 0
