"""Tandem through the gateway: one streamed ``GenerateStream`` request a sample, and the services'
model information (``GetInfo``) for the report.

A gateway sample holds, besides the client-side timings, the gateway's own statistics of the request
(``SERVER_FIELDS`` of its final ``GenerateStats``) and its round-by-round figures (``ROUND_FIELDS``,
and ``AUTO_ROUND_FIELDS`` where the gateway reports them). A request the gateway decoded without the
drafter is flagged (``fallback``), never hidden.
"""

from __future__ import annotations

import time

from tandem.bench import modes as M
from tandem.bench.http_stream import one_off
from tandem.bench.settings import Settings, base_sample
from tandem.bench.workload import Prompt

ROUND_FIELDS = ("k", "proposed", "accepted", "rejection_position", "bonus", "draft_ms", "verify_ms", "overhead_ms",
                "round_ms")
# the automatic draft length's figures (gateway/draft_length/); read when the gateway's RoundStats has them
AUTO_ROUND_FIELDS = ("k_reason", "expected_tokens", "expected_tokens_per_ms", "lookup_tokens", "emitted",
                     "source",   # source: where the block came from (copy, ahead, wait, propose; "" plain)
                     "wire_ms", "gateway_ms", "stream_ms")   # where a round's time beyond the forward went
SERVER_FIELDS = ("prompt_tokens", "new_tokens", "rounds", "proposed", "accepted", "mean_acceptance_length",
                 "acceptance_rate", "ttft_ms", "total_ms", "draft_ms", "verify_ms", "overhead_ms", "prefill_ms",
                 "tokens_per_second", "speculative", "fallback_reason", "draft_model", "target_model")


class GatewayRunner:
    """Requests through the gateway's gRPC API (``GenerateStream``), one sample each."""

    def __init__(self, address: str):
        import grpc

        from tandem.pb import gateway_grpc, gateway_pb2
        from tandem.serving import CHANNEL_OPTIONS

        self.address = address
        self.pb = gateway_pb2
        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.stub = gateway_grpc.GatewayStub(self.channel)
        self.adaptive_field = M.adaptive_field(gateway_pb2.GenerateRequest)
        names = set(gateway_pb2.RoundStats.DESCRIPTOR.fields_by_name)
        self.round_fields = ROUND_FIELDS + tuple(f for f in AUTO_ROUND_FIELDS if f in names)
        self.has_auto = "k_reason" in names

    def close(self) -> None:
        self.channel.close()

    def request(self, mode: M.Mode, prompt: Prompt, settings: Settings, max_tokens: int | None = None):
        from tandem.pb import common_pb2

        seed = settings.seed_for(prompt)
        sampling = common_pb2.SamplingParams(temperature=settings.temperature, top_k=settings.top_k,
                                             top_p=settings.top_p, seed=seed or 0, has_seed=seed is not None)
        req = self.pb.GenerateRequest(prompt=prompt.text, chat=True, max_tokens=max_tokens or settings.max_tokens,
                                      sampling=sampling, ignore_eos=settings.ignore_eos,
                                      no_speculation=not mode.speculative, draft_length=mode.k)
        if mode.adaptive:
            if not self.adaptive_field:
                raise RuntimeError("this gateway has no adaptive draft length")
            setattr(req, self.adaptive_field, mode.confidence)
        elif mode.speculative and self.adaptive_field:
            setattr(req, self.adaptive_field, 0.0)  # a fixed k drafts exactly k tokens; auto: its k exactly
        if "cache_salt" in req.DESCRIPTOR.fields_by_name:       # each request a prompt never sent before
            req.cache_salt = one_off()["cache_salt"]
        return req

    def run(self, mode: M.Mode, prompt: Prompt, settings: Settings, repeat: int = 0,
            max_tokens: int | None = None) -> dict:
        import grpc

        sample = base_sample(mode, prompt, repeat)
        req = self.request(mode, prompt, settings, max_tokens)
        token_ids: list[int] = []
        text: list[str] = []
        chunk_ms: list[float] = []          # arrival of each chunk with tokens (ms from the send) ...
        chunk_tokens: list[int] = []        # ... and its token count: decode speed and inter-token latency
        ttft = None
        stats = None
        finish = ""
        t0 = time.perf_counter()
        try:
            for chunk in self.stub.GenerateStream(req, timeout=settings.timeout_s):
                if chunk.token_ids:
                    chunk_ms.append((time.perf_counter() - t0) * 1e3)
                    chunk_tokens.append(len(chunk.token_ids))
                    if ttft is None:
                        ttft = chunk_ms[-1] / 1e3
                token_ids.extend(chunk.token_ids)
                text.append(chunk.text)
                if chunk.HasField("stats"):
                    stats = chunk.stats
                    finish = chunk.finish_reason
        except grpc.RpcError as err:
            sample["error"] = f"{err.code().name}: {err.details()}"
            return sample
        wall = time.perf_counter() - t0
        sample.update(wall_ms=wall * 1e3, ttft_ms=(ttft or wall) * 1e3, new_tokens=len(token_ids),
                      tokens_per_s=len(token_ids) / wall if wall > 0 else 0.0, finish_reason=finish,
                      token_ids=token_ids, text="".join(text), chunk_ms=chunk_ms, chunk_tokens=chunk_tokens)
        if stats is not None:
            sample["prompt_tokens"] = stats.prompt_tokens
            sample["server"] = {f: getattr(stats, f) for f in SERVER_FIELDS}
            sample["server"]["accepted_per_position"] = list(stats.accepted_per_position)
            sample["server"]["proposed_per_position"] = list(stats.proposed_per_position)
            sample["rounds"] = {f: [getattr(r, f) for r in stats.round_stats] for f in self.round_fields}
            if mode.speculative and (not stats.speculative or stats.fallback_reason):
                # the gateway decoded (part of) this request without the drafter: flagged, never hidden
                sample["fallback"] = stats.fallback_reason or "the gateway decoded without the drafter"
        return sample


def fetch_info(verifier_addr: str | None, drafter_addr: str | None, gateway_addr: str | None = None) -> dict:
    """Model information from the verifier and drafter (GetInfo), for the report; a verifier in the gateway's
    process (no address of its own): the target's name from the gateway's GetStatus. Never raises."""
    import grpc
    from google.protobuf.json_format import MessageToDict

    from tandem.pb import common_pb2, drafter_grpc, verifier_grpc
    from tandem.serving import CHANNEL_OPTIONS

    out: dict = {}
    for name, addr, stub_cls in (("target", verifier_addr, verifier_grpc.VerifierStub),
                                 ("drafter", drafter_addr, drafter_grpc.DrafterStub)):
        if not addr:
            continue
        try:
            with grpc.insecure_channel(addr, options=CHANNEL_OPTIONS) as ch:
                msg = stub_cls(ch).GetInfo(common_pb2.GetInfoRequest(), timeout=30)
            info = MessageToDict(msg.model if name == "target" else msg, preserving_proto_field_name=True)
            info["address"] = addr
            out[name] = info
        except grpc.RpcError as err:
            out[name] = {"address": addr, "error": f"{err.code().name}: {err.details()}"}
    if not verifier_addr and gateway_addr:
        from tandem.pb import gateway_grpc, gateway_pb2

        try:
            with grpc.insecure_channel(gateway_addr, options=CHANNEL_OPTIONS) as ch:
                status = gateway_grpc.GatewayStub(ch).GetStatus(gateway_pb2.GetStatusRequest(), timeout=30)
            out["target"] = {"model_name": status.target_model, "address": f"in the gateway's process ({gateway_addr})"}
        except grpc.RpcError as err:
            out["target"] = {"address": gateway_addr, "error": f"{err.code().name}: {err.details()}"}
    return out
