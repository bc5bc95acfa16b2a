"""Real gRPC servers on loopback ports, run on an asyncio loop in a background thread."""

from __future__ import annotations

import asyncio
import threading

import grpc

from tandem.pb import drafter_grpc, gateway_grpc, verifier_grpc


class LoopThread:
    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout=120):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class Stack:
    """Verifier + drafter + gateway servers in this process; sync stubs for the test."""

    def __init__(self, target, drafter, draft_length=4, drafter_present=True):
        from drafter_service.server import start_drafter
        from gateway.engine import GatewayConfig
        from gateway.server import connect_gateway, start_gateway
        from verifier_service.server import start_verifier

        self.lt = LoopThread()
        self.target, self.drafter = target, drafter
        self.verifier_service = self.lt.run(start_verifier(target))
        self.drafter_service = self.lt.run(start_drafter(drafter)) if drafter_present else None
        self.verifier_addr = f"127.0.0.1:{self.verifier_service.port}"
        self.drafter_addr = f"127.0.0.1:{self.drafter_service.port}" if drafter_present else None
        self.gateway = self.lt.run(connect_gateway(self.verifier_addr, self.drafter_addr,
                                                   GatewayConfig(draft_length=draft_length, max_tokens_limit=512)))
        self.gateway_service = self.lt.run(start_gateway(self.gateway))
        self.gateway_addr = f"127.0.0.1:{self.gateway_service.port}"
        self.channels = [grpc.insecure_channel(a) for a in (self.gateway_addr, self.verifier_addr,
                                                            self.drafter_addr or self.verifier_addr)]
        self.gateway_stub = gateway_grpc.GatewayStub(self.channels[0])
        self.verifier_stub = verifier_grpc.VerifierStub(self.channels[1])
        self.drafter_stub = drafter_grpc.DrafterStub(self.channels[2])

    def close(self):
        for ch in self.channels:
            ch.close()
        for svc in (self.gateway_service, self.drafter_service, self.verifier_service):
            if svc is not None:
                self.lt.run(svc.stop(0))
        self.lt.close()


class InProcessGateway:
    """A gateway served in this process on ``lt`` in front of a verifier and one drafter (or none), with a
    sync stub. ``config``: GatewayConfig fields over ``defaults``."""

    def __init__(self, lt, verifier_addr, drafter_addr, defaults=None, **config):
        from gateway.engine import GatewayConfig
        from gateway.server import connect_gateway, start_gateway

        self.lt = lt
        config = {**(defaults or {}), **config}
        self.gateway = lt.run(connect_gateway(verifier_addr, drafter_addr, GatewayConfig(**config), wait_s=60))
        self.service = lt.run(start_gateway(self.gateway))
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.service.port}")
        self.stub = gateway_grpc.GatewayStub(self.channel)

    def generate(self, request, timeout: float = 120):
        return self.stub.Generate(request, timeout=timeout)

    def close(self):
        self.channel.close()
        self.lt.run(self.service.stop(0))
        self.lt.run(self.gateway.verifier.close())
        if self.gateway.drafter is not None:
            self.lt.run(self.gateway.drafter.close())
