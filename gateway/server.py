"""Starting the gateway: connect to the verifier (and the drafter), then serve the client API."""

from __future__ import annotations

import asyncio
import sys

import grpc

from gateway.api import GatewayServicer
from gateway.clients import DrafterClient, VerifierClient
from gateway.engine import Gateway, GatewayConfig
from tandem.pb import gateway_pb2
from tandem.serving import Service, add_servicer, start_service

SERVICE = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"]
SERVICE_NAME = SERVICE.full_name


async def connect_gateway(verifier_address, drafter_address: str | None, config: GatewayConfig,
                          wait_s: float = 120.0, interceptors=(), drafter_timeout_s: float = 15.0,
                          verifier_timeout_s: float = 120.0) -> Gateway:
    """Waits for the verifier (its tokenizer is needed to serve anything); the drafter may come later.
    ``verifier_address``: host:port, or a verifier in this process (``gateway.local_verifier.LocalVerifier``).
    ``interceptors``: client interceptors for both channels (tracing: ``Telemetry.client_interceptors()``)."""
    if isinstance(verifier_address, str):
        verifier = VerifierClient(verifier_address, timeout_s=verifier_timeout_s, interceptors=interceptors)
        info = await _wait_for_verifier(verifier, verifier_address, wait_s)
    else:
        verifier = verifier_address
        info = await verifier.get_info()
    drafter = (DrafterClient(drafter_address, timeout_s=drafter_timeout_s, interceptors=interceptors)
               if drafter_address else None)
    gateway = Gateway(verifier, drafter, info, config)
    if drafter is not None:
        try:
            usable = await gateway.usable_drafter()
        except Exception as exc:  # incompatible: say so now, refuse per request later
            print(f"[tandem] gateway: drafter at {drafter_address}: {exc}", file=sys.stderr, flush=True)
        else:
            if usable is None:    # down: say so plainly if it is a TLS mismatch (a wrong flag, not a late start)
                wrong = await _tls_mismatch("drafter", drafter_address)
                if wrong:
                    print(f"[tandem] gateway: {wrong} (until then: target-only decoding)", file=sys.stderr,
                          flush=True)
    return gateway


async def _tls_mismatch(what: str, address: str) -> str | None:
    """The one-line explanation if the node at ``address`` and this process's client disagree on TLS (a probe
    of the address: tandem.health.probe), else None."""
    from tandem import security
    from tandem.health import mismatch, probe

    found = await asyncio.to_thread(probe, address, 2.0)
    return mismatch(what, address, found, security.default().client_tls, node="gateway")


async def _wait_for_verifier(verifier: VerifierClient, address: str, wait_s: float):
    """The verifier's GetInfo, waited for up to ``wait_s`` (it may still be loading its model). While it has
    not answered, the address is probed now and then: a TLS mismatch (one side with TLS, the other without)
    fails at once with the flag to change, not as handshake errors until the wait ends. Past the wait, an
    unreachable verifier is named with the reason (tandem.health.Unreachable)."""
    from tandem import security
    from tandem.health import TlsMismatch, Unreachable, explain

    call = asyncio.ensure_future(verifier.get_info(wait_s=wait_s))
    delay = 0.5
    try:
        while True:
            done, _ = await asyncio.wait({call}, timeout=delay)
            if done:
                break
            wrong = await _tls_mismatch("verifier", address)
            if wrong:
                raise TlsMismatch(wrong)
            delay = min(2 * delay, 5.0)
        try:
            return call.result()
        except grpc.aio.AioRpcError as err:
            if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            wrong = await _tls_mismatch("verifier", address)
            if wrong:
                raise TlsMismatch(wrong) from None
            reason = await asyncio.to_thread(explain, "verifier", address, err.code(), err.details(),
                                             security.default().client_tls, node="gateway")
            waited = f" (waited {wait_s:.0f} s: --wait)" if wait_s else ""
            raise Unreachable(f"{reason or f'the verifier at {address}: {err.code().name}: {err.details()}'}"
                              f"{waited}") from None
    finally:
        if not call.done():
            call.cancel()


MESSAGE_OVERHEAD_BYTES = 64 * 1024      # a GenerateRequest's fields besides its prompt


async def start_gateway(gateway: Gateway, host: str = "127.0.0.1", port: int = 0, interceptors=()) -> Service:
    """Serves the client API. A request message larger than --max-request-bytes (plus the other fields' room)
    is refused by gRPC itself (RESOURCE_EXHAUSTED) before it is read."""
    servicer = GatewayServicer(gateway)
    limit = gateway.config.max_request_bytes
    service = await start_service("gateway", lambda s: add_servicer(s, servicer, SERVICE),
                                  [SERVICE_NAME], host, port, interceptors=interceptors,
                                  max_receive_bytes=limit + MESSAGE_OVERHEAD_BYTES if limit else None)
    service.metrics = gateway.metrics
    return service
