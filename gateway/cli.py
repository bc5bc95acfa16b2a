"""``tandem serve-gateway`` (== ``python -m gateway``): the gateway's own flags and start-up."""

from __future__ import annotations

from tandem.flags import DEFAULT_HOST, flag, server_flags

DEFAULT_DRAFT_LENGTH = 2
DEFAULT_DRAFT_CONFIDENCE = 0.0  # confidence stop off: it did not pay end to end on the 2-core CPU (BENCHMARKS.md)


def configure(p) -> None:
    flag(p, "verifier", f"{DEFAULT_HOST}:50062", help="verifier address host:port")
    flag(p, "drafter", f"{DEFAULT_HOST}:50061", help="drafter address host:port ('' for none: target only)")
    flag(p, "draft-length", DEFAULT_DRAFT_LENGTH, int, help="default draft length k (tokens proposed per round; "
         "2 measured best with the shipped drafter on a 2-core CPU, see BENCHMARKS.md)")
    flag(p, "draft-confidence", DEFAULT_DRAFT_CONFIDENCE, float, help="adaptive draft length: the drafter ends a "
         "block early, before a token whose drafter probability is below this, so a round drafts 1..k tokens "
         "(0 = always k; requests may set their own)")
    flag(p, "max-tokens-limit", 4096, int, help="largest max_tokens a request may ask for")
    flag(p, "no-speculation", help="decode with the target alone by default (the baseline)", cast=bool)
    flag(p, "wait", 300.0, float, help="seconds to wait for the verifier at start")
    flag(p, "max-concurrent-requests", 64, int, help="requests served at once; more are refused at once with "
         "RESOURCE_EXHAUSTED (0: no limit)")
    flag(p, "drafter-retry-max", 15.0, float, help="longest wait in seconds between probes of a failed drafter "
         "(the wait starts at 1 s and doubles)")
    flag(p, "drafter-timeout", 15.0, float, help="deadline in seconds of one Propose call (the first one of a "
         "request reads the whole prompt); past it the request goes on with target-only decoding")
    flag(p, "verifier-timeout", 120.0, float, help="deadline in seconds of one call to the verifier (prefill of "
         "a long prompt included); past it the client gets UNAVAILABLE")
    server_flags(p, 50051)


async def run(args) -> int:
    from gateway.engine import GatewayConfig
    from gateway.server import connect_gateway, start_gateway
    from tandem import telemetry
    from tandem.serving import serve_until_stopped

    tracing = telemetry.setup("tandem-gateway")
    config = GatewayConfig(draft_length=args.draft_length, draft_confidence=args.draft_confidence,
                           max_tokens_limit=args.max_tokens_limit,
                           no_speculation=args.no_speculation,
                           max_concurrent_requests=args.max_concurrent_requests,
                           drafter_retry_max_s=args.drafter_retry_max)
    gateway = await connect_gateway(args.verifier, args.drafter or None, config, wait_s=args.wait,
                                    interceptors=tracing.client_interceptors(),
                                    drafter_timeout_s=args.drafter_timeout, verifier_timeout_s=args.verifier_timeout)
    service = await start_gateway(gateway, args.host, args.port, interceptors=tracing.server_interceptors())
    return await serve_until_stopped(service, "gateway", args, tracing)
