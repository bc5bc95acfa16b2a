"""Server-sent events, and a client's disconnect noticed while a reply is being computed or streamed.

``EventStream`` sends an async iterator of ``sse`` events and closes it (so the generation behind it is
cancelled and its sessions freed) as soon as the client leaves; ``until_disconnect`` runs a coroutine and
cancels it when the client leaves, for the replies that are not streamed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

from starlette.responses import Response

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def sse(obj) -> bytes:
    """One event: ``obj`` as compact JSON after ``data:``."""
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


async def until_disconnect(receive, coro):
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
                await until_disconnect(receive, pump())
        finally:
            with contextlib.suppress(Exception):
                await self.events.aclose()
            await self.on_close()

