"""A TCP relay that delays every byte by a fixed time in each direction: the stand-in for `tc netem delay`
where the kernel has no sch_netem. Usage (inside the drafter's network namespace):

    python netns_relay.py --listen 198.18.0.1 --port-file F --to 198.18.0.1:PORT --delay-file D

The delay (milliseconds, a number in the file D) is re-read every 50 ms. Order is kept: each direction is
one FIFO whose chunks leave ``delay`` after they arrived. It runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
from pathlib import Path


class Delay:
    def __init__(self, path: Path):
        self.path, self.seconds = path, 0.0

    async def follow(self) -> None:
        while True:
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


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--listen", required=True)
    p.add_argument("--port-file", required=True)
    p.add_argument("--to", required=True)
    p.add_argument("--delay-file", required=True)
    args = p.parse_args()
    host, port = args.to.rsplit(":", 1)
    delay = Delay(Path(args.delay_file))
    follower = asyncio.create_task(delay.follow())

    async def handle(c_reader, c_writer):
        try:
            u_reader, u_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            c_writer.close()
            return
        for w in (c_writer, u_writer):
            w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(pipe(c_reader, u_writer, delay), pipe(u_reader, c_writer, delay))

    server = await asyncio.start_server(handle, args.listen, 0)
    Path(args.port_file).write_text(str(server.sockets[0].getsockname()[1]))
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    follower.cancel()
    server.close()


if __name__ == "__main__":
    asyncio.run(main())
