"""gRPC boundary of the verifier: protobuf in, domain calls, protobuf out. Nothing else."""

from __future__ import annotations

from tandem.pb_convert import draft_from_pb, sampling_from_pb, target_info_to_pb
from verifier_service.metrics import VerifierMetrics
from tandem.pb import common_pb2, verifier_grpc, verifier_pb2
from tandem.serving import abort_on_error
from verifier_service.info import describe
from verifier_service.target import Target


class VerifierServicer(verifier_grpc.VerifierServicer):
    def __init__(self, target: Target, metrics: VerifierMetrics | None = None):
        self.target = target
        self.metrics = metrics or VerifierMetrics(target)
        self._info = target_info_to_pb(describe(target))

    async def GetInfo(self, request, context):
        return self._info

    @abort_on_error
    async def StartSession(self, request, context):
        # A cancelled call (client gone, deadline passed) stops the prefill at its next chunk, keeping no session.
        first, ms = await self.target.astart(request.session_id, list(request.prompt_ids),
                                             sampling_from_pb(request.sampling), owner=request.session_token,
                                             max_draft_length=request.max_draft_length,
                                             cache_salt=request.cache_salt)
        self.metrics.prefilled(ms)
        return verifier_pb2.StartSessionReply(first_token=first, compute_ms=ms)

    @abort_on_error
    async def Verify(self, request, context):
        outcome = await self.target.averify(request.session_id, draft_from_pb(request.draft), request.session_token)
        self.metrics.verified(len(request.draft), outcome)
        return verifier_pb2.VerifyReply(accepted=outcome.accepted, next_token=outcome.next_token,
                                        bonus=outcome.bonus, compute_ms=outcome.compute_ms,
                                        queue_ms=outcome.queue_ms, forward_ms=outcome.forward_ms,
                                        forward_rows=outcome.forward_rows)

    @abort_on_error
    async def EndSession(self, request, context):
        return common_pb2.EndSessionReply(found=self.target.end(request.session_id, request.session_token))
