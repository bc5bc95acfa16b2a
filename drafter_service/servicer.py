"""gRPC boundary of the drafter: protobuf in, domain calls, protobuf out. Nothing else."""

from __future__ import annotations

import asyncio
import contextlib

from drafter_service.ahead import AheadPath
from tandem.pb_convert import draft_to_pb, info_to_pb, sampling_from_pb
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

    async def DraftAhead(self, request_iterator, context):
        """Streams the session's path (drafter_service.ahead) as it is drafted, following the syncs the gateway
        sends; the session ends with the stream."""
        first = await anext(request_iterator, None)
        if first is None:
            return
        path = AheadPath(self.drafter, first.session_id, first.session_token, sampling_from_pb(first.sampling))
        path.sync(first.position, list(first.appended_tokens), first.ahead)
        synced = asyncio.Event()

        async def follow() -> None:
            async for msg in request_iterator:
                path.sync(msg.position, list(msg.appended_tokens), msg.ahead)
                synced.set()

        reader = asyncio.ensure_future(follow())
        waiter: asyncio.Future | None = None
        try:
            while True:
                while path.wanted() and not reader.done():
                    chunk = await asyncio.to_thread(path.draft)
                    if chunk is not None:
                        self.metrics.proposed(len(chunk.tokens), chunk.compute_ms)
                        yield drafter_pb2.DraftChunk(path_id=chunk.path_id, position=chunk.position, last=chunk.last,
                                                     tokens=draft_to_pb(chunk.tokens), compute_ms=chunk.compute_ms)
                if reader.done():
                    break
                waiter = asyncio.ensure_future(synced.wait())
                await asyncio.wait([reader, waiter], return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                synced.clear()              # wanted() is read again after this: no sync is missed
            reader.result()                 # a sync the drafter refused ends the stream with its status
        finally:
            reader.cancel()
            if waiter is not None:
                waiter.cancel()
            with contextlib.suppress(Exception):
                await asyncio.to_thread(path.finish)
            with contextlib.suppress(Exception):
                self.drafter.end_session(first.session_id, first.session_token)
