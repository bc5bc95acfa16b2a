"""The ``tandem`` command: the launcher of the three services and of the offline tools. Every flag has a
``TANDEM_*`` environment variable of the same name (``--gateway-port`` <-> ``TANDEM_GATEWAY_PORT``); flags
win. Each command's flags live with the code they configure (``drafter_service.cli``, ``gateway.cli``, ...)
and are imported only for that command, so ``tandem serve-drafter`` never imports torch."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys

COMMANDS = {
    # name: (configure, run, help); run(args) -> int, may be a coroutine function
    "serve-drafter": ("drafter_service.cli:configure", "drafter_service.cli:run",
                      "run the drafter service (ONNX Runtime, no torch)"),
    "serve-verifier": ("verifier_service.cli:configure", "verifier_service.cli:run",
                       "run the verifier service (target model)"),
    "serve-gateway": ("gateway.cli:configure", "gateway.cli:run",
                      "run the gateway (client API, draft -> verify rounds)"),
    "up": ("tandem.up:configure", "tandem.up:run", "start drafter, verifier and gateway locally and wait"),
    "demo": ("tandem.up:configure_demo", "tandem.up:run_demo",
             "start all three locally, generate once with a round timeline, stop"),
    "generate": ("tandem.generate:configure", "tandem.generate:run", "ask a gateway for a completion"),
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
