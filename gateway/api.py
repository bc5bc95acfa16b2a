"""The client-facing gRPC servicer: GenerateRequest -> GenerateParams, Steps -> replies. Nothing else: errors
become status codes in ``tandem.serving`` (one table, ``tandem.errors``)."""

from __future__ import annotations

import contextlib

from gateway.clients import set_request_deadline
from gateway.engine import Gateway, GenerateParams
from gateway.stats import RequestStats
from tandem.pb_convert import round_to_pb, sampling_from_pb
from tandem.pb import gateway_grpc, gateway_pb2


def params_from_pb(req: gateway_pb2.GenerateRequest) -> GenerateParams:
    return GenerateParams(prompt=req.prompt, prompt_ids=tuple(req.prompt_ids), chat=req.chat,
                          max_tokens=req.max_tokens, sampling=sampling_from_pb(req.sampling),
                          draft_length=req.draft_length, no_speculation=req.no_speculation,
                          ignore_eos=req.ignore_eos,
                          draft_confidence=req.draft_confidence if req.HasField("draft_confidence") else None,
                          cache_salt=req.cache_salt)


def stats_to_pb(s: RequestStats) -> gateway_pb2.GenerateStats:
    """Every GenerateStats field from the RequestStats attribute of the same name; rounds from their record."""
    fields = {f.name: getattr(s, f.name) for f in gateway_pb2.GenerateStats.DESCRIPTOR.fields
              if f.name != "round_stats"}
    return gateway_pb2.GenerateStats(**fields, round_stats=[round_to_pb(r) for r in s.round_log])


class GatewayServicer(gateway_grpc.GatewayServicer):
    def __init__(self, gateway: Gateway):
        self.gateway = gateway

    async def Generate(self, request, context):
        params = params_from_pb(request)
        stats = RequestStats()
        token_ids: list[int] = []
        text: list[str] = []
        set_request_deadline(context.time_remaining())     # upstream calls end before the client's deadline
        async with self.gateway.admit(), contextlib.aclosing(self.gateway.generate(params, stats)) as steps:
            async for step in steps:
                token_ids.extend(step.token_ids)
                text.append(step.text)
        return gateway_pb2.GenerateReply(text="".join(text), token_ids=token_ids,
                                         finish_reason=self.gateway.finish_reason(token_ids, params),
                                         stats=stats_to_pb(stats))

    async def GenerateStream(self, request, context):
        params = params_from_pb(request)
        stats = RequestStats()
        token_ids: list[int] = []
        set_request_deadline(context.time_remaining())
        async with self.gateway.admit(), contextlib.aclosing(self.gateway.generate(params, stats)) as steps:
            async for step in steps:
                token_ids.extend(step.token_ids)
                yield gateway_pb2.GenerateChunk(text=step.text, token_ids=step.token_ids)
        yield gateway_pb2.GenerateChunk(finish_reason=self.gateway.finish_reason(token_ids, params),
                                        stats=stats_to_pb(stats))


    async def GetStatus(self, request, context):
        return status_to_pb(self.gateway.status())


def status_to_pb(status: dict) -> gateway_pb2.GatewayStatus:
    return gateway_pb2.GatewayStatus(**status)
