"""Starting the gateway: connect to the verifier (and the drafter), then serve the client API."""

from __future__ import annotations

import sys

from gateway.api import GatewayServicer
from gateway.clients import DrafterClient, VerifierClient
from gateway.engine import Gateway, GatewayConfig
from tandem.pb import gateway_grpc, gateway_pb2
from tandem.serving import Service, start_service

SERVICE_NAME = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name


async def connect_gateway(verifier_address: str, drafter_address: str | None, config: GatewayConfig,
                          wait_s: float = 120.0, interceptors=(), drafter_timeout_s: float = 15.0,
                          verifier_timeout_s: float = 120.0) -> Gateway:
    """Waits for the verifier (its tokenizer is needed to serve anything); the drafter may come later.
    ``interceptors``: client interceptors for both channels (tracing: ``Telemetry.client_interceptors()``)."""
    verifier = VerifierClient(verifier_address, timeout_s=verifier_timeout_s, interceptors=interceptors)
    info = await verifier.get_info(wait_s=wait_s)
    drafter = (DrafterClient(drafter_address, timeout_s=drafter_timeout_s, interceptors=interceptors)
               if drafter_address else None)
    gateway = Gateway(verifier, drafter, info, config)
    if drafter is not None:
        try:
            await gateway.usable_drafter()
        except Exception as exc:  # incompatible: say so now, refuse per request later
            print(f"[tandem] gateway: drafter at {drafter_address}: {exc}", file=sys.stderr, flush=True)
    return gateway


async def start_gateway(gateway: Gateway, host: str = "127.0.0.1", port: int = 0, interceptors=()) -> Service:
    servicer = GatewayServicer(gateway)
    service = await start_service("gateway", lambda s: gateway_grpc.add_GatewayServicer_to_server(servicer, s),
                                  [SERVICE_NAME], host, port, interceptors=interceptors)
    service.metrics = gateway.metrics
    return service
