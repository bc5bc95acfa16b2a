"""gRPC clients for the drafter and the verifier, filling the ports the round loop uses.

Every call has a deadline. Drafter failures become DrafterUnavailable (the request goes on with
target-only decoding); a drafter that lost the session becomes DrafterLostSession (resend context).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from gateway.ports import DrafterLostSession, DrafterUnavailable
from tandem.convert import draft_from_pb, draft_to_pb, info_from_pb, sampling_to_pb
from tandem.pb import common_pb2, drafter_grpc, drafter_pb2, verifier_grpc, verifier_pb2
from tandem.serving import CHANNEL_OPTIONS, ERROR_KIND_KEY
from tandem.types import DraftToken, ModelInfo, Proposal, SamplingParams, VerifyOutcome

DRAFTER_FAILURES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL,
                    grpc.StatusCode.UNKNOWN, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED,
                    grpc.StatusCode.UNIMPLEMENTED}


def open_channel(address: str, interceptors: Sequence = ()) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS, interceptors=list(interceptors) or None)


def _error_kind(err: grpc.aio.AioRpcError) -> str:
    for key, value in err.trailing_metadata() or ():
        if key == ERROR_KIND_KEY:
            return value
    return ""


class VerifierClient:
    def __init__(self, address: str, timeout_s: float = 60.0, interceptors: Sequence = ()):
        self.address = address
        self.timeout_s = timeout_s
        self.channel = open_channel(address, interceptors)
        self.stub = verifier_grpc.VerifierStub(self.channel)

    async def get_info(self, wait_s: float | None = None) -> verifier_pb2.TargetInfo:
        """The target's info and tokenizer; waits up to ``wait_s`` for the verifier to come up."""
        return await self.stub.GetInfo(common_pb2.GetInfoRequest(), timeout=wait_s or self.timeout_s,
                                       wait_for_ready=wait_s is not None)

    async def start(self, session_id: str, prompt_ids: Sequence[int], sampling: SamplingParams) -> tuple[int, float]:
        reply = await self.stub.StartSession(
            verifier_pb2.StartSessionRequest(session_id=session_id, prompt_ids=list(prompt_ids),
                                             sampling=sampling_to_pb(sampling)), timeout=self.timeout_s)
        return reply.first_token, reply.compute_ms

    async def verify(self, session_id: str, draft: Sequence[DraftToken]) -> VerifyOutcome:
        reply = await self.stub.Verify(verifier_pb2.VerifyRequest(session_id=session_id, draft=draft_to_pb(draft)),
                                       timeout=self.timeout_s)
        return VerifyOutcome(reply.accepted, reply.next_token, reply.bonus, reply.compute_ms)

    async def end(self, session_id: str) -> None:
        await self.stub.EndSession(common_pb2.EndSessionRequest(session_id=session_id), timeout=5.0)

    async def close(self) -> None:
        await self.channel.close()


class DrafterClient:
    def __init__(self, address: str, timeout_s: float = 10.0, interceptors: Sequence = ()):
        self.address = address
        self.timeout_s = timeout_s
        self.channel = open_channel(address, interceptors)
        self.stub = drafter_grpc.DrafterStub(self.channel)

    async def info(self, wait_s: float | None = None) -> ModelInfo:
        try:
            msg = await self.stub.GetInfo(common_pb2.GetInfoRequest(), timeout=wait_s or self.timeout_s,
                                          wait_for_ready=wait_s is not None)
        except grpc.aio.AioRpcError as err:
            raise DrafterUnavailable(f"{self.address}: {err.code().name}: {err.details()}") from err
        return info_from_pb(msg)

    async def propose(self, session_id: str, prefix_length: int, appended_tokens: Sequence[int], k: int,
                      sampling: SamplingParams) -> Proposal:
        request = drafter_pb2.ProposeRequest(session_id=session_id, prefix_length=prefix_length,
                                             appended_tokens=list(appended_tokens), k=k,
                                             sampling=sampling_to_pb(sampling))
        try:
            reply = await self.stub.Propose(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.INVALID_ARGUMENT and _error_kind(err) == "UnknownSessionError":
                raise DrafterLostSession(err.details()) from err
            if err.code() in DRAFTER_FAILURES:
                raise DrafterUnavailable(f"{self.address}: {err.code().name}: {err.details()}") from err
            raise
        return Proposal(tuple(draft_from_pb(reply.tokens)), reply.compute_ms)

    async def end(self, session_id: str) -> None:
        try:
            await self.stub.EndSession(common_pb2.EndSessionRequest(session_id=session_id), timeout=2.0)
        except grpc.aio.AioRpcError:
            pass  # a dead drafter holds no sessions worth freeing

    async def close(self) -> None:
        await self.channel.close()
