"""gRPC clients for the drafter and the verifier, filling the ports the round loop uses.

Every call has a deadline. A verifier failure becomes the domain error its status code stands for
(``tandem.errors``), naming the verifier. Every drafter failure (any status code, a reply that does not
parse) becomes DrafterUnavailable, naming the drafter: the request goes on with target-only decoding.
NOT_FOUND from the drafter (restarted, evicted) becomes DrafterLostSession: resend the context; after
RESOURCE_EXHAUSTED (no room for this session) the session is in ``refused``: that request goes on without
the drafter, which is not down. Clients decide on status codes, never on message text.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Sequence

import grpc

from gateway.ahead import DraftedPath
from gateway.ports import DrafterLostSession, DrafterUnavailable
from tandem.pb_convert import draft_from_pb, draft_to_pb, info_from_pb, sampling_to_pb, target_info_from_pb
from tandem.errors import error_for_status
from tandem.pb import common_pb2, drafter_grpc, drafter_pb2, verifier_grpc, verifier_pb2
from tandem.serving import CHANNEL_OPTIONS
from tandem.types import DraftToken, ModelInfo, Proposal, SamplingParams, TargetInfo, VerifyOutcome

def open_channel(address: str, interceptors: Sequence = (), security=None) -> grpc.aio.Channel:
    """A channel with TLS and the bearer token when ``security`` (default: the process's) asks for them."""
    from tandem import security as sec

    security = security or sec.default()
    credentials = security.channel_credentials()
    options = [*CHANNEL_OPTIONS, *security.channel_options()]
    chain = [*security.client_interceptors(), *interceptors] or None
    if credentials is not None:
        return grpc.aio.secure_channel(address, credentials, options=options, interceptors=chain)
    return grpc.aio.insecure_channel(address, options=options, interceptors=chain)


# The client's deadline, as an absolute time.monotonic(), for the request being served in this task
# (set by the gateway's API from its ServicerContext). Upstream calls end a little before it, so
# the client hears UNAVAILABLE from the gateway rather than its own DEADLINE_EXCEEDED.
_request_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("tandem_request_deadline",
                                                                                default=None)


def set_request_deadline(time_remaining: float | None) -> None:
    """Called by the client-facing servicer with ``context.time_remaining()`` (None: no deadline)."""
    _request_deadline.set(None if time_remaining is None else time.monotonic() + time_remaining)


async def _not_past_deadline(call) -> None:
    """Waits for ``call`` (an EndSession) no longer than the client's deadline allows; past that the call
    goes on in the background under its own timeout, so freeing a session never delays the reply."""
    await asyncio.wait_for(asyncio.shield(call), call_timeout(3600.0) if _request_deadline.get() else None)


def call_timeout(timeout_s: float) -> float:
    """``timeout_s``, shortened to end before the client's deadline (keeping a margin to answer)."""
    deadline = _request_deadline.get()
    if deadline is None:
        return timeout_s
    remaining = deadline - time.monotonic()
    margin = max(0.05, min(1.0, 0.1 * remaining))
    return max(0.01, min(timeout_s, remaining - margin))


class VerifierClient:
    def __init__(self, address: str, timeout_s: float = 60.0, interceptors: Sequence = ()):
        self.address = address
        self.timeout_s = timeout_s
        self.channel = open_channel(address, interceptors)
        self.stub = verifier_grpc.VerifierStub(self.channel)

    async def get_info(self, wait_s: float | None = None) -> TargetInfo:
        """The target's info and tokenizer; waits up to ``wait_s`` for the verifier to come up."""
        return target_info_from_pb(await self.stub.GetInfo(common_pb2.GetInfoRequest(),
                                                           timeout=wait_s or self.timeout_s,
                                                           wait_for_ready=wait_s is not None))

    async def _call(self, rpc, request):
        """One call within the request's deadline; a failure becomes the domain error its status code stands
        for (``tandem.errors.error_for_status``: a deadline passed is Unavailable), naming the verifier."""
        try:
            return await rpc(request, timeout=call_timeout(self.timeout_s))
        except grpc.aio.AioRpcError as err:
            raise error_for_status(err.code().name, f"verifier {self.address}: {err.code().name}: "
                                   f"{err.details()}") from err

    async def start(self, session_id: str, prompt_ids: Sequence[int], sampling: SamplingParams, token: str = "",
                    max_draft_length: int = 0, cache_salt: str = "") -> tuple[int, float]:
        reply = await self._call(self.stub.StartSession, verifier_pb2.StartSessionRequest(
            session_id=session_id, prompt_ids=list(prompt_ids), sampling=sampling_to_pb(sampling),
            session_token=token, max_draft_length=max_draft_length, cache_salt=cache_salt))
        return reply.first_token, reply.compute_ms

    async def verify(self, session_id: str, draft: Sequence[DraftToken], token: str = "") -> VerifyOutcome:
        reply = await self._call(self.stub.Verify, verifier_pb2.VerifyRequest(
            session_id=session_id, draft=draft_to_pb(draft), session_token=token))
        return VerifyOutcome(reply.accepted, reply.next_token, reply.bonus, reply.compute_ms, reply.queue_ms,
                             reply.forward_ms, reply.forward_rows)

    async def end(self, session_id: str, token: str = "") -> None:
        await _not_past_deadline(self.stub.EndSession(common_pb2.EndSessionRequest(session_id=session_id,
                                                                                    session_token=token),
                                                      timeout=5.0))

    async def close(self) -> None:
        await self.channel.close()


class DrafterClient:
    def __init__(self, address: str, timeout_s: float = 10.0, interceptors: Sequence = ()):
        self.address = address
        self.timeout_s = timeout_s
        self.channel = open_channel(address, interceptors)
        self.stub = drafter_grpc.DrafterStub(self.channel)
        # sessions a Propose was sent for: only those can exist on the drafter, so only those need an EndSession
        # (an auto request that stayed plain never calls the drafter; behind a 10 ms link its End cost 10 ms)
        self._opened: set[str] = set()
        # sessions the drafter had no room for (RESOURCE_EXHAUSTED): their requests draft no more, but the drafter
        # is up (the gateway does not turn speculation off for everyone over them)
        self.refused: set[str] = set()
        self.ahead_supported = True     # False once a DraftAhead stream said UNIMPLEMENTED (an older drafter)

    async def info(self, wait_s: float | None = None) -> ModelInfo:
        try:
            msg = await self.stub.GetInfo(common_pb2.GetInfoRequest(), timeout=wait_s or self.timeout_s,
                                          wait_for_ready=wait_s is not None)
        except grpc.aio.AioRpcError as err:
            raise DrafterUnavailable(f"drafter {self.address}: {err.code().name}: {err.details()}") from err
        except Exception as exc:                      # noqa: BLE001 - a reply that does not parse
            raise DrafterUnavailable(f"drafter {self.address}: unusable GetInfo reply ({exc!r})") from exc
        return info_from_pb(msg)

    async def propose(self, session_id: str, prefix_length: int, appended_tokens: Sequence[int], k: int,
                      sampling: SamplingParams, min_confidence: float = 0.0, token: str = "") -> Proposal:
        request = drafter_pb2.ProposeRequest(session_id=session_id, prefix_length=prefix_length,
                                             appended_tokens=list(appended_tokens), k=k,
                                             sampling=sampling_to_pb(sampling), min_confidence=min_confidence,
                                             session_token=token)
        self._opened.add(session_id)
        try:
            reply = await self.stub.Propose(request, timeout=call_timeout(self.timeout_s))
            return Proposal(tuple(draft_from_pb(reply.tokens)), reply.compute_ms)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:            # restarted or evicted: resend the context
                raise DrafterLostSession(err.details()) from err
            if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                self.refused.add(session_id)
            raise DrafterUnavailable(f"drafter {self.address}: {err.code().name}: {err.details()}") from err
        except Exception as exc:                      # noqa: BLE001 - a reply that does not parse
            raise DrafterUnavailable(f"drafter {self.address}: unusable Propose reply ({exc!r})") from exc

    async def end(self, session_id: str, token: str = "") -> str | None:
        """Frees the session; returns why the drafter could not be reached (UNAVAILABLE: it died since the
        request's last Propose), else None."""
        if session_id not in self._opened:
            return None             # never proposed for: the drafter holds no such session
        self._opened.discard(session_id)
        self.refused.discard(session_id)
        try:
            await _not_past_deadline(self.stub.EndSession(common_pb2.EndSessionRequest(session_id=session_id,
                                                                                        session_token=token),
                                                          timeout=2.0))
        except grpc.aio.AioRpcError as err:     # a dead drafter holds no sessions worth freeing
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                return f"drafter unavailable: drafter {self.address}: {err.code().name}: {err.details()}"
        except TimeoutError:
            pass
        return None

    def open_ahead(self, session_id: str, token: str, sampling: SamplingParams) -> "AheadStream | None":
        """A DraftAhead stream for one session; None once this drafter turned out not to serve DraftAhead."""
        return AheadStream(self, session_id, token, sampling) if self.ahead_supported else None

    async def close(self) -> None:
        await self.channel.close()


CLOSE_WAIT_S = 5.0                  # a closed DraftAhead stream's time to finish before it is cancelled
_CLOSING: set[asyncio.Future] = set()   # streams finishing in the background (referenced until done)


class AheadUnsupported(DrafterUnavailable):
    """The drafter does not serve DraftAhead (an older drafter): the gateway asks it with Propose instead."""


class AheadStream:
    """One session's DraftAhead stream (``drafter_service.ahead``): ``sync`` sends the real sequence as it grows
    and how many tokens to keep drafted beyond it; the drafted path streams back into ``path`` as it is drafted
    (``gateway.ahead.DraftedPath``), and ``usable``/``wait`` give the tokens a round may propose. Any failure of
    the stream becomes DrafterUnavailable (UNIMPLEMENTED: AheadUnsupported), raised by the next call; the session
    of a stream refused for lack of room (RESOURCE_EXHAUSTED) joins the client's ``refused``, as with Propose."""

    def __init__(self, client: "DrafterClient", session_id: str, token: str, sampling: SamplingParams):
        self.client, self.session_id, self.token, self.sampling = client, session_id, token, sampling
        self.path = DraftedPath()
        self.compute_ms = 0.0                   # drafter compute the stream reported (off the critical path)
        self._sent = 0                          # tokens of the sequence sent so far
        self._arrived = asyncio.Event()
        self._error: DrafterUnavailable | None = None
        deadline = _request_deadline.get()
        self._call = client.stub.DraftAhead(timeout=call_timeout(3600.0) if deadline else None)
        self._reader = asyncio.ensure_future(self._read())

    async def sync(self, sequence: Sequence[int], ahead: int) -> None:
        """The real sequence is ``sequence`` (it only grows); keep ``ahead`` tokens drafted beyond it."""
        self._raise()
        msg = drafter_pb2.DraftAheadRequest(position=self._sent, appended_tokens=list(sequence[self._sent:]),
                                            ahead=ahead)
        if self._sent == 0:
            msg.session_id, msg.session_token = self.session_id, self.token
            msg.sampling.CopyFrom(sampling_to_pb(self.sampling))
        try:
            await self._call.write(msg)
        except Exception as exc:                      # noqa: BLE001 - the stream is gone: its reader says why
            await asyncio.wait([self._reader], timeout=1.0)
            self._raise()
            raise DrafterUnavailable(f"drafter {self.client.address}: DraftAhead stream closed ({exc!r})") from exc
        self._sent = len(sequence)
        self.path.stalled = False       # what the drafter said it had no more of, it reconsiders with this context

    def usable(self, sequence: Sequence[int]) -> list[DraftToken]:
        """The drafted tokens a round may propose after ``sequence`` now (drafted from exactly that context)."""
        self._raise()
        return self.path.usable(sequence)

    async def wait(self, sequence: Sequence[int], n: int, timeout_s: float) -> list[DraftToken]:
        """``usable(sequence)`` once it holds ``n`` tokens or the drafter says it has no more for this context
        (maybe none: a drafter with nothing to propose), or what it holds after ``timeout_s`` (nothing then:
        DrafterUnavailable)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._arrived.clear()
            got = self.usable(sequence)
            if len(got) >= n or self.path.exhausted(sequence):
                return got
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if got:
                    return got
                raise DrafterUnavailable(f"drafter {self.client.address}: no drafted tokens within "
                                         f"{timeout_s:.0f} s")
            try:            # not wait_for: on 3.11 it drops a cancellation that comes with the event
                async with asyncio.timeout(remaining):
                    await self._arrived.wait()
            except TimeoutError:
                pass

    async def close(self) -> None:
        """Ends the stream (and so the drafter's session) without waiting for the drafter: the stream is
        half-closed at once, and it is given ``CLOSE_WAIT_S`` in the background to finish (the drafter reads
        the last sync first), then cancelled."""
        if self._reader.done():
            return
        try:
            await self._call.done_writing()
        except Exception:                             # noqa: BLE001 - already broken: the reader knows why
            self._call.cancel()
            return
        task = asyncio.ensure_future(self._drain())
        _CLOSING.add(task)
        task.add_done_callback(_CLOSING.discard)

    async def _drain(self) -> None:
        done, _ = await asyncio.wait([self._reader], timeout=CLOSE_WAIT_S)
        if not done:
            self._call.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    async def _read(self) -> None:
        try:
            async for chunk in self._call:
                self.path.receive(chunk.path_id, chunk.position, draft_from_pb(chunk.tokens), chunk.last)
                self.compute_ms += chunk.compute_ms
                self._arrived.set()
            self._error = DrafterUnavailable(f"drafter {self.client.address}: DraftAhead stream ended")
        except grpc.aio.AioRpcError as err:
            what = f"drafter {self.client.address}: {err.code().name}: {err.details()}"
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                self.client.ahead_supported = False
                self._error = AheadUnsupported(what)
            elif err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:     # no room for this session: not down
                self.client.refused.add(self.session_id)
                self._error = DrafterUnavailable(what)
            elif err.code() != grpc.StatusCode.CANCELLED:
                self._error = DrafterUnavailable(what)
            else:
                self._error = DrafterUnavailable(f"drafter {self.client.address}: DraftAhead stream cancelled")
        except Exception as exc:                      # noqa: BLE001 - a chunk that does not parse
            self._error = DrafterUnavailable(f"drafter {self.client.address}: unusable DraftAhead chunk ({exc!r})")
        self._arrived.set()
