"""Starting the verifier service (aio gRPC server around a loaded Target)."""

from __future__ import annotations

import asyncio
import contextlib

from tandem.pb import verifier_grpc, verifier_pb2
from tandem.serving import Service, evict_period, start_service
from verifier_service.servicer import VerifierServicer
from verifier_service.target import Target

SERVICE_NAME = verifier_pb2.DESCRIPTOR.services_by_name["Verifier"].full_name


async def start_verifier(target: Target, host: str = "127.0.0.1", port: int = 0, interceptors=()) -> Service:
    servicer = VerifierServicer(target)
    service = await start_service("verifier", lambda s: verifier_grpc.add_VerifierServicer_to_server(servicer, s),
                                  [SERVICE_NAME], host, port, interceptors=interceptors)
    service.metrics = servicer.metrics
    service.evictor = asyncio.create_task(_evict_forever(target, evict_period(target.sessions.ttl_s)))
    return service


async def _evict_forever(target: Target, every_s: float = 30.0) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        while True:
            await asyncio.sleep(every_s)
            target.sessions.evict_idle()
