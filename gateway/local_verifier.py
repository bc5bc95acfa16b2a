"""The verifier in the gateway's own process (``serve-gateway --verifier local``, ``tandem up``'s default):
the round loop's ``VerifierPort`` over a ``verifier_service.target.Target`` loaded here, no gRPC between them.

On one machine the gRPC hop between gateway and verifier costs each round a serialisation and a wake-up on
both sides and the verifier's gRPC server thread, on the same cores as the target's forward (BENCHMARKS.md:
about a millisecond of CPU per token on the verifier's side alone). Here a round's block goes to the
target's scheduler directly, and the forward (one C call: ``native_layers``) runs without the GIL while the
gateway streams the last round. The gRPC contract stays what a verifier on another machine is reached by;
errors keep their meaning: each is raised as the domain error its status code would have become
(``tandem.errors``), so the gateway decides exactly as it does for a remote verifier.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from tandem.errors import PeerFailed, error_for_status, log_bug, wire_of
from tandem.types import DraftToken, SamplingParams, TargetInfo, VerifyOutcome

log = logging.getLogger(__name__)
NAME = "verifier (in this process)"


def build_tokenizer_first(spec: str) -> bool:
    """For a GGUF target: builds the gateway's tokenizer from the file's converted tokenizer (the JSON the
    verifier will send) before the target loads, while the process is small (``engine.build_tokenizer_ahead``:
    why). True if built; anything else (another kind of target, a conversion that fails here) is left to the
    usual order, where the target's loading reports it."""
    from gateway.engine import build_tokenizer_ahead
    from tandem.models import resolve
    from verifier_service.gguf_model import converted_tokenizer_info

    try:
        loc = resolve(spec)
        if not loc.gguf_file:
            return False
        info = converted_tokenizer_info(loc.directory / loc.gguf_file)
        text = info.json()
    except Exception as e:      # noqa: BLE001 - an optimisation: the target's own load says what is wrong
        log.debug("tokenizer not built ahead of the target: %s", e)
        return False
    build_tokenizer_ahead(text, info.bos_token, info.eos_token)
    return True


class LocalVerifier:
    """``VerifierPort`` over ``target`` (a loaded ``Target``); ``metrics``: the verifier's Prometheus metrics,
    kept as its servicer keeps them."""

    address = "local"

    def __init__(self, target, metrics=None):
        from verifier_service.info import describe
        from verifier_service.metrics import VerifierMetrics

        self.target = target
        self.metrics = metrics or VerifierMetrics(target)
        self._info = describe(target)
        self._evictor: asyncio.Task | None = None
        self._metrics_server = None

    def keep_house(self) -> None:
        """Frees idle sessions' caches after their time to live, as the verifier service does (in the running
        event loop, until ``close``)."""
        from tandem.sessions import evict_forever

        if self._evictor is None:
            self._evictor = asyncio.get_running_loop().create_task(evict_forever(self.target.sessions))

    def serve_metrics(self, port: int | None, host: str) -> None:
        """The verifier's Prometheus metrics on ``port`` (None: off; 0: a free one), as serve-verifier's."""
        from tandem import metrics

        self._metrics_server = metrics.serve(self.metrics, port, host)

    async def get_info(self, wait_s: float | None = None) -> TargetInfo:
        return self._info

    async def start(self, session_id: str, prompt_ids: Sequence[int], sampling: SamplingParams, token: str = "",
                    max_draft_length: int = 0, cache_salt: str = "") -> tuple[int, float]:
        try:
            first, ms = await self.target.astart(session_id, list(prompt_ids), sampling, owner=token,
                                                 max_draft_length=max_draft_length, cache_salt=cache_salt)
        except Exception as exc:
            raise _as_peer_error(exc, "StartSession") from None
        self.metrics.prefilled(ms)
        return first, ms

    async def verify(self, session_id: str, draft: Sequence[DraftToken], token: str = "") -> VerifyOutcome:
        try:
            outcome = await self.target.averify(session_id, draft, token)
        except Exception as exc:
            raise _as_peer_error(exc, "Verify") from None
        self.metrics.verified(len(draft), outcome)
        return outcome

    async def end(self, session_id: str, token: str = "") -> None:
        try:
            self.target.end(session_id, token)
        except Exception as exc:         # noqa: BLE001 - as a remote EndSession: best effort, never the request's
            log.warning("%s: EndSession %s: %s", NAME, session_id, exc)

    async def close(self) -> None:
        if self._evictor is not None:
            self._evictor.cancel()
            self._evictor = None
        if self._metrics_server is not None:
            self._metrics_server.stop()
            self._metrics_server = None


def _as_peer_error(exc: Exception, where: str) -> Exception:
    """The error the gateway would see from a remote verifier raising ``exc``: a domain error as its status
    code reads back, anything else (a bug) as PeerFailed with a request id, the exception logged under it."""
    wire = wire_of(exc)
    if wire is not None:
        return error_for_status(wire.grpc, f"{NAME}: {wire.grpc}: {exc}")
    request_id = log_bug(log, f"{NAME} {where}", exc)
    return PeerFailed(f"{NAME}: internal error in {where} (request id {request_id}; the details are in the log)")
