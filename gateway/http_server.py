"""The HTTP server: uvicorn on the gateway's own event loop, bounded against slow and numerous clients.

    handle = await serve_http(build_app(gateway, ...), "127.0.0.1", 8000)
    ...
    await handle.stop()

A client may take at most --http-read-timeout to send a request's head and body (then 408 and dropped),
and at most --http-max-connections connections are open at once (one more is closed as it is accepted);
request heads are limited to h11's 16 KiB, idle keep-alive connections close after 5 s. uvicorn's signal
handlers are not installed: the gateway's own start-up handles SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from dataclasses import dataclass

from gateway.openai_schema import ApiError

DEFAULT_READ_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 256


@dataclass
class HttpHandle:
    """A running HTTP server: where it listens, and ``stop``."""

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
