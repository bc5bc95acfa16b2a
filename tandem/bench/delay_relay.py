"""A TCP relay that holds every byte for a fixed time in each direction: an added network round trip
between two services on one machine (the stand-in for ``tc netem delay`` where there is no netem, and
for a link between two machines in ``tandem bench --two-machine``)::

    python -m tandem.bench.delay_relay --listen 127.0.0.1 --port-file F --to 127.0.0.1:PORT
        (--delay-ms MS | --delay-file D)

A round trip through it gains twice the delay. ``--delay-file``: the delay in milliseconds is read
from the file every 50 ms (so a test can change it while connections stay open). Order is kept: each
direction is one FIFO whose chunks leave ``delay`` after they arrived. It runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
from pathlib import Path

from tandem.flags import write_port_file


class Delay:
    """The one-way delay in seconds: fixed, or followed from a file (milliseconds)."""

    def __init__(self, ms: float = 0.0, path: Path | None = None):
        self.path, self.seconds = path, ms / 1000.0

    async def follow(self) -> None:
        while self.path is not None:
            with contextlib.suppress(OSError, ValueError):
                self.seconds = float(self.path.read_text().strip() or 0) / 1000.0
            await asyncio.sleep(0.05)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: Delay) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    async def receive():
        while True:
            data = await reader.read(65536)
            await queue.put((loop.time() + delay.seconds, data))
            if not data:
                return

    async def send():
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    try:
        await asyncio.gather(receive(), send())
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def serve(listen: str, to: str, delay: Delay, port_file: Path, port: int = 0) -> None:
    """Relays connections to ``listen``:port (0: a free one, written to ``port_file``) to ``to``."""
    host, to_port = to.rsplit(":", 1)
    follower = asyncio.create_task(delay.follow())

    async def handle(c_reader, c_writer):
        try:
            u_reader, u_writer = await asyncio.open_connection(host, int(to_port))
        except OSError:
            c_writer.close()
            return
        for w in (c_writer, u_writer):
            w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(pipe(c_reader, u_writer, delay), pipe(u_reader, c_writer, delay))

    server = await asyncio.start_server(handle, listen, port)
    write_port_file(port_file, server.sockets[0].getsockname()[1])
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    follower.cancel()
    server.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tandem.bench.delay_relay", description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", required=True, help="address to listen on")
    p.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    p.add_argument("--port-file", required=True, help="the bound port is written here")
    p.add_argument("--to", required=True, help="host:port to relay to")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--delay-ms", type=float, help="one-way delay in milliseconds")
    g.add_argument("--delay-file", help="file holding the one-way delay in milliseconds (re-read every 50 ms)")
    args = p.parse_args(argv)
    delay = Delay(args.delay_ms or 0.0, Path(args.delay_file) if args.delay_file else None)
    asyncio.run(serve(args.listen, args.to, delay, Path(args.port_file), args.port))


if __name__ == "__main__":
    main()
