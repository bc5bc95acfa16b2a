"""Starting the drafter service (aio gRPC server around an ONNX drafter). No torch here."""

from __future__ import annotations

import asyncio
import contextlib

from drafter_service.servicer import DrafterServicer
from tandem.pb import drafter_grpc, drafter_pb2
from tandem.serving import Service, evict_period, start_service

SERVICE_NAME = drafter_pb2.DESCRIPTOR.services_by_name["Drafter"].full_name


async def start_drafter(drafter, host: str = "127.0.0.1", port: int = 0, interceptors=()) -> Service:
    servicer = DrafterServicer(drafter)
    service = await start_service("drafter", lambda s: drafter_grpc.add_DrafterServicer_to_server(servicer, s),
                                  [SERVICE_NAME], host, port, interceptors=interceptors)
    service.metrics = servicer.metrics
    ttl = getattr(getattr(drafter, "sessions", None), "ttl_s", 600.0)
    service.evictor = asyncio.create_task(_evict_forever(drafter, evict_period(ttl)))
    return service


async def _evict_forever(drafter, every_s: float = 30.0) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        while True:
            await asyncio.sleep(every_s)
            evict = getattr(drafter, "evict_idle", None)
            if evict is not None:
                evict()
