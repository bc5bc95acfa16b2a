"""Starting the drafter service (aio gRPC server around a drafter). No torch here."""

from __future__ import annotations

import asyncio

from drafter_service.servicer import DrafterServicer
from tandem.pb import drafter_grpc, drafter_pb2
from tandem.serving import Service, start_service
from tandem.sessions import evict_forever

SERVICE_NAME = drafter_pb2.DESCRIPTOR.services_by_name["Drafter"].full_name


async def start_drafter(drafter, host: str = "127.0.0.1", port: int = 0, interceptors=()) -> Service:
    servicer = DrafterServicer(drafter)
    service = await start_service("drafter", lambda s: drafter_grpc.add_DrafterServicer_to_server(servicer, s),
                                  [SERVICE_NAME], host, port, interceptors=interceptors)
    service.metrics = servicer.metrics
    service.evictor = asyncio.create_task(evict_forever(drafter.sessions))
    return service
