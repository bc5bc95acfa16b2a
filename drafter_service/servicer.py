"""gRPC boundary of the drafter: protobuf in, domain calls, protobuf out. Nothing else."""

from __future__ import annotations

import asyncio

from tandem.convert import draft_to_pb, info_to_pb, sampling_from_pb
from drafter_service.metrics import DrafterMetrics
from tandem.pb import common_pb2, drafter_grpc, drafter_pb2
from tandem.serving import abort_on_error, complete_or_undo


class DrafterServicer(drafter_grpc.DrafterServicer):
    def __init__(self, drafter, metrics: DrafterMetrics | None = None):
        self.drafter = drafter      # a drafter_service.drafter.Drafter (built by drafter_service.factory.load_drafter)
        self.metrics = metrics or DrafterMetrics(drafter)
        self._info = info_to_pb(drafter.info)

    async def GetInfo(self, request, context):
        return self._info

    @abort_on_error
    async def Propose(self, request, context):
        # A cancelled Propose (client gone, deadline passed) ends the session: the gateway stops drafting
        # for that request anyway, and a session created after its EndSession would otherwise linger.
        proposal = await complete_or_undo(
            asyncio.to_thread(self.drafter.propose, request.session_id, request.prefix_length,
                              list(request.appended_tokens), request.k, sampling_from_pb(request.sampling),
                              request.min_confidence, request.session_token),
            lambda: self.drafter.end_session(request.session_id, request.session_token))
        self.metrics.proposed(len(proposal.tokens), proposal.compute_ms)
        return drafter_pb2.Proposal(tokens=draft_to_pb(proposal.tokens), compute_ms=proposal.compute_ms)

    @abort_on_error
    async def EndSession(self, request, context):
        return common_pb2.EndSessionReply(found=self.drafter.end_session(request.session_id, request.session_token))
