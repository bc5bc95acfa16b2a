"""Starting the drafter service (aio gRPC server around a drafter). No torch here."""

from __future__ import annotations

import asyncio

from drafter_service.servicer import DrafterServicer
from tandem.pb import drafter_pb2
from tandem.serving import Service, add_servicer, start_service
from tandem.sessions import evict_forever

SERVICE = drafter_pb2.DESCRIPTOR.services_by_name["Drafter"]
SERVICE_NAME = SERVICE.full_name


async def start_drafter(drafter, host: str = "127.0.0.1", port: int = 0, interceptors=()) -> Service:
    servicer = DrafterServicer(drafter)
    service = await start_service("drafter", lambda s: add_servicer(s, servicer, SERVICE),
                                  [SERVICE_NAME], host, port, interceptors=interceptors)
    service.metrics = servicer.metrics
    service.evictor = asyncio.create_task(evict_forever(drafter.sessions))
    return service
