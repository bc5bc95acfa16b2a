"""Starting the verifier service (aio gRPC server around a loaded Target)."""

from __future__ import annotations

import asyncio

from tandem.pb import verifier_pb2
from tandem.serving import Service, add_servicer, start_service
from tandem.sessions import evict_forever
from verifier_service.servicer import VerifierServicer
from verifier_service.target import Target

SERVICE = verifier_pb2.DESCRIPTOR.services_by_name["Verifier"]
SERVICE_NAME = SERVICE.full_name


async def start_verifier(target: Target, host: str = "127.0.0.1", port: int = 0, interceptors=()) -> Service:
    servicer = VerifierServicer(target)
    service = await start_service("verifier", lambda s: add_servicer(s, servicer, SERVICE),
                                  [SERVICE_NAME], host, port, interceptors=interceptors)
    service.metrics = servicer.metrics
    service.evictor = asyncio.create_task(evict_forever(target.sessions))
    return service
