"""``tandem serve-gateway`` (== ``python -m gateway``): the gateway's own flags and start-up."""

from __future__ import annotations

import sys

from tandem.flags import DEFAULT_HOST, draft_length, flag, server_flags

DEFAULT_HTTP_PORT = 8080
DEFAULT_DRAFT_CONFIDENCE = 0.0  # confidence stop off: it did not pay end to end on the 2-core CPU (BENCHMARKS.md)


def configure(p) -> None:
    flag(p, "verifier", f"{DEFAULT_HOST}:50062", help="verifier address host:port, or 'local': load the target in "
         "this process (the flags under 'the target, with --verifier local'): no gRPC hop between gateway and "
         "verifier, which on one machine makes each token cheaper (what tandem up runs)")
    flag(p, "drafter", f"{DEFAULT_HOST}:50061", help="drafter address host:port ('' for none: target only)")
    flag(p, "draft-length", "auto", draft_length, help="draft length k of every round: 'auto' chooses it each "
         "round from the measured verify/draft/network costs and the session's acceptance (0 = a plain step "
         "where speculation does not pay); N pins it (requests may pin their own)")
    flag(p, "max-draft-length", 8, int, help="the longest block auto drafts")
    flag(p, "max-copy-length", 16, int, help="beside a model-free drafter node (--drafter suffix), whose blocks are "
         "copies of text already at the gateway: the longest block auto verifies (at least --max-draft-length)")
    flag(p, "probe-budget", 0.005, float, help="auto: while speculation loses, a block now and then (as long "
         "as would pay for predictable text) probes the drafter: after 4 plain rounds, then as often as keeps "
         "the refused probes' measured cost within this share of plain decoding's throughput (0.005: ~0.5 %%, "
         "about every 200th round where a probe costs two plain steps), doubling the interval while probes "
         "lose; 0: the doubling alone, up to every 256th round")
    flag(p, "draft-confidence", DEFAULT_DRAFT_CONFIDENCE, float, help="adaptive draft length: the drafter ends a "
         "block early, before a token whose drafter probability is below this, so a round drafts 1..k tokens "
         "(0 = always k; requests may set their own)")
    flag(p, "max-tokens-limit", 4096, int, help="largest max_tokens a request may ask for")
    flag(p, "no-speculation", help="decode with the target alone by default (the baseline)", cast=bool)
    flag(p, "no-local-lookup", help="always ask the drafter, also for a block that prompt lookup over the "
         "sequence supplies whole (by default the gateway copies such a block itself: the same tokens, no "
         "round trip to the drafter)", cast=bool)
    flag(p, "unseeded-sampling", "coupled", help="how a sampled request without a seed is verified: 'coupled' "
         "(the gateway gives both nodes a secret seed for the request: the text is the target's own sample "
         "whatever the drafter sends, so a drafter can only cost speed; a request's seed always couples) or "
         "'rejection' (rejection sampling, exact only if the drafter reports the distribution it drew from)",
         choices=("coupled", "rejection"))
    flag(p, "no-draft-ahead", help="ask the drafter for each block when the round needs it (Propose), instead of "
         "having it draft the next block while the verifier checks this one (its DraftAhead stream)", cast=bool)
    flag(p, "plain-ahead", 0, int, help="with drafting ahead, tokens the drafter keeps drafted beyond the sequence "
         "while rounds are plain steps too (e.g. 3): when the target's next token is the drafter's guess, the rest is "
         "a block ready at once, at no drafter time. It costs a message each way a round on the gateway's cores, so "
         "it pays only with a drafter that guesses the target's token often (0: during plain steps the drafter "
         "only follows the text, every 32 tokens)")
    flag(p, "drafter-shares-cpus", help="the drafter runs a model on the verifier's cores (one box; `tandem up` sets "
         "it for a model drafter unless --drafter-cpus and --verifier-cpus are disjoint): no drafting ahead (it would take cores from the "
         "forward it overlaps), and the draft-length choice counts a drafted token's time against every session "
         "that shares the verifier's forward", cast=bool)
    flag(p, "lookup-only", help="no drafter node: speculate only with blocks that prompt lookup over the sequence "
         "supplies, copied by the gateway (the baseline that shows what a drafter node adds)", cast=bool)
    flag(p, "wait", 300.0, float, help="seconds to wait for the verifier at start")
    flag(p, "max-concurrent-requests", 64, int, help="requests served at once; more are refused at once with "
         "RESOURCE_EXHAUSTED (0: no limit)")
    flag(p, "drafter-retry-max", 15.0, float, help="longest wait in seconds between probes of a failed drafter "
         "(the wait starts at 1 s and doubles)")
    flag(p, "drafter-timeout", 15.0, float, help="deadline in seconds of one Propose call (the first one of a "
         "request reads the whole prompt); past it the request goes on with target-only decoding")
    flag(p, "verifier-timeout", 120.0, float, help="deadline in seconds of one call to the verifier (prefill of "
         "a long prompt included); past it the client gets UNAVAILABLE")
    flag(p, "http-port", DEFAULT_HTTP_PORT, int, help="serve the OpenAI-compatible HTTP API and the chat page on "
         "this port (same TLS and token as gRPC; 0: a free port; -1: off)")
    flag(p, "http-host", None, help="address of the HTTP API (default: --host)")
    flag(p, "served-model-name", None, help="the model name the HTTP API reports (default: the target's)")
    flag(p, "max-request-bytes", 2 << 20, int, help="largest request: a prompt's text, an HTTP body, a gRPC message; "
         "larger ones are refused before any work is done on them (HTTP 413, gRPC RESOURCE_EXHAUSTED)")
    flag(p, "max-prompt-tokens", 0, int, help="longest prompt in tokens (0: the target's context); longer ones are "
         "refused (HTTP 400, gRPC INVALID_ARGUMENT)")
    flag(p, "allowed-hosts", "", help="comma-separated names the HTTP API answers to besides IP addresses, "
         "localhost, this machine's name and --http-host ('.example.com': its subdomains; '*': any). Other Host "
         "headers are refused (403): a web page cannot reach the API by pointing its own name at this machine")
    flag(p, "allowed-origins", "", help="comma-separated web origins (scheme://host[:port]) whose pages may call "
         "the HTTP API from a browser ('*': any site). The chat page, and clients that send no Origin (curl, "
         "SDKs, servers), need none; other pages are refused (403)")
    flag(p, "http-read-timeout", 30.0, float, help="seconds a client has to send an HTTP request's head and body; "
         "slower ones are answered 408 and dropped")
    flag(p, "http-max-connections", 256, int, help="HTTP connections open at once; more are closed as accepted")
    server_flags(p, 50051)
    from verifier_service.cli import model_flags

    model_flags(p.add_argument_group("the target, with --verifier local (as serve-verifier's flags; its metrics on "
                                     "--metrics-port + 1)"))


def _listed(value: str | None) -> tuple[str, ...]:
    """A comma-separated flag's items."""
    return tuple(item.strip() for item in (value or "").split(",") if item.strip())


async def run(args) -> int:
    local = args.verifier == "local"
    if local:
        from verifier_service.cli import openmp_environment

        openmp_environment(args.omp_spincount)            # before anything imports torch
    from gateway.engine import GatewayConfig
    from gateway.server import connect_gateway, start_gateway
    from tandem import telemetry
    from tandem.serving import serve_until_stopped

    verifier = await _local_verifier(args) if local else None

    tracing = telemetry.setup("tandem-gateway")
    config = GatewayConfig(draft_length=args.draft_length, max_draft_length=args.max_draft_length,
                           max_copy_length=args.max_copy_length,
                           draft_confidence=args.draft_confidence,
                           max_tokens_limit=args.max_tokens_limit,
                           no_speculation=args.no_speculation,
                           max_concurrent_requests=args.max_concurrent_requests,
                           drafter_retry_max_s=args.drafter_retry_max,
                           local_lookup=not args.no_local_lookup, probe_budget=args.probe_budget,
                           draft_ahead=not args.no_draft_ahead, plain_ahead=args.plain_ahead,
                           drafter_shares_cpus=args.drafter_shares_cpus, lookup_only=args.lookup_only,
                           unseeded_sampling=args.unseeded_sampling,
                           max_prompt_tokens=args.max_prompt_tokens, max_request_bytes=args.max_request_bytes)
    gateway = await connect_gateway(verifier or args.verifier, None if args.lookup_only else args.drafter or None,
                                    config, wait_s=args.wait,
                                    interceptors=tracing.client_interceptors(),
                                    drafter_timeout_s=args.drafter_timeout, verifier_timeout_s=args.verifier_timeout)
    http = None
    if args.http_port is not None and args.http_port >= 0:        # before gRPC: a port in use fails cleanly
        from gateway.http_api import build_app
        from gateway.http_server import serve_http
        from tandem import security

        sec = security.default()
        host = args.http_host or args.host
        sec.check_listen(host, "gateway HTTP API")
        app = build_app(gateway, token=sec.token, model_name=args.served_model_name or gateway.target.model_name,
                        allowed_hosts=_listed(args.allowed_hosts), allowed_origins=_listed(args.allowed_origins),
                        bound_host=host)
        try:
            http = await serve_http(app, host, args.http_port, ssl_certfile=sec.tls_cert, ssl_keyfile=sec.tls_key,
                                    read_timeout_s=args.http_read_timeout, max_connections=args.http_max_connections)
        except OSError as exc:
            raise ValueError(f"gateway HTTP API: cannot listen on {host}:{args.http_port} ({exc.strerror or exc}): "
                             "pick another port with --http-port, or --http-port -1 for none") from None
        print(f"[tandem] gateway: OpenAI-compatible API on {http.url}/v1, chat page on {http.url}/", flush=True,
              file=sys.stderr)
    service = await start_gateway(gateway, args.host, args.port, interceptors=tracing.server_interceptors())
    if verifier is not None and args.metrics_port is not None:        # beside the gateway's, as tandem up numbers them
        verifier.serve_metrics(args.metrics_port + 1 if args.metrics_port else 0, args.host)
    try:
        return await serve_until_stopped(service, "gateway", args, tracing, on_stop=http.stop if http else None)
    finally:
        if verifier is not None:
            await verifier.close()


async def _local_verifier(args):
    """``--verifier local``: the target loaded here as serve-verifier loads it (its start-up line says how)."""
    from gateway.local_verifier import LocalVerifier, build_tokenizer_first
    from verifier_service.cli import load_target

    build_tokenizer_first(args.target)      # its parse's memory freed before the target's is taken
    verifier = LocalVerifier(await load_target(args))
    verifier.keep_house()
    return verifier
