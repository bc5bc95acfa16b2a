"""The ``tandem`` command: the launcher of the three services and of the offline tools. Every flag has a
``TANDEM_*`` environment variable of the same name (``--gateway-port`` <-> ``TANDEM_GATEWAY_PORT``); flags
win. Each command's flags live with the code they configure (``drafter_service.cli``, ``gateway.cli``, ...)
and are imported only for that command, so ``tandem serve-drafter`` never imports torch."""

from __future__ import annotations

import argparse
import asyncio
import difflib
import importlib
import os
import re
import sys

COMMANDS = {
    # name: (configure, run, help); run(args) -> int, may be a coroutine function
    "serve-drafter": ("drafter_service.cli:configure", "drafter_service.cli:run",
                      "run the drafter service (ONNX Runtime, no torch)"),
    "serve-verifier": ("verifier_service.cli:configure", "verifier_service.cli:run",
                       "run the verifier service (target model)"),
    "serve-gateway": ("gateway.cli:configure", "gateway.cli:run",
                      "run the gateway (client API, draft -> verify rounds)"),
    "up": ("tandem.up:configure", "tandem.up:run", "start the drafter and the gateway (the target in its process) locally and wait"),
    "demo": ("tandem.up:configure_demo", "tandem.up:run_demo",
             "start them as up does, generate once with a round timeline, stop"),
    "generate": ("tandem.generate:configure", "tandem.generate:run", "ask a gateway for a completion"),
    "export-drafter": ("tandem.export:configure", "tandem.export:run",
                       "export a causal LM to an ONNX drafter (standard decoder layout) and check parity"),
    "distill": ("tandem.distill.cli:configure", "tandem.distill.cli:run",
                "train a small drafter for a target and export it to ONNX"),
    "bench": ("tandem.bench.cli:configure", "tandem.bench.cli:run",
              "benchmark speculative vs plain decoding on Spec-Bench"),
    "certs": ("tandem.security:configure_certs", "tandem.security:run_certs",
              "create a small CA and node certificates (server + client) for TLS / mTLS between the machines"),
    "gen-protos": ("tandem.pb:configure", "tandem.pb:run",
                   "generate the gRPC stubs (tandem/v1/) from protos/ in a checkout or editable install"),
    "health": ("tandem.health:configure", "tandem.health:run",
               "ask a drafter, verifier or gateway whether it is serving (gRPC health; exit code 0 if so)"),
}


# Address flags of commands whose flags live elsewhere: host without a port gets the service's default port
# (gRPC would dial 443). tandem generate and tandem health do the same in their own run().
ADDRESS_FLAGS = {"serve-gateway": {"verifier": "verifier", "drafter": "drafter"}}
NO_COMMAND = ""          # build_parser(only=NO_COMMAND): the command list alone, no command module imported


def _resolve(ref):
    if callable(ref):
        return ref
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


def version() -> str:
    """The installed tandem-spec distribution's version, else the checkout's pyproject.toml version."""
    from importlib import metadata

    try:
        return metadata.version("tandem-spec")
    except metadata.PackageNotFoundError:
        pass
    try:
        import tomllib
        from pathlib import Path

        with open(Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as f:
            return tomllib.load(f)["project"]["version"] + " (checkout)"
    except (OSError, KeyError, ValueError):
        return "unknown"


def plain(text: str) -> str:
    """Docstring text without its reST markup: ``literal`` -> literal, :role:`x` -> x."""
    text = re.sub(r":[a-z]+:`([^`]*)`", r"\1", text)
    return re.sub(r"``([^`]*)``", r"\1", text)


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, with reST markup stripped from descriptions and flag help."""

    def _format_text(self, text):
        return super()._format_text(plain(text))

    def _expand_help(self, action):
        return plain(super()._expand_help(action))


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; ``only``: configure that command's flags alone (None: all, NO_COMMAND: none)."""
    parser = argparse.ArgumentParser(prog="tandem", description=__doc__.split("\n\n")[0].replace("\n", " "),
                                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"tandem {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (configure, _run, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter,
                           allow_abbrev=False)
        if only in (None, name):
            try:
                _resolve(configure)(p)
            except ImportError as exc:
                p.description = f"{help_text} (unavailable here: {exc})"
    return parser


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[command]


def _closest(word: str, choices) -> str:
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {match[0]}?" if match else ""


def _unknown_command(word: str) -> int:
    print(f"tandem: unknown command {word!r}{_closest(word, COMMANDS)} (tandem --help lists the commands)",
          file=sys.stderr)
    return 2


def _unknown_arguments(parser: argparse.ArgumentParser, command: str, extras: list[str]) -> int:
    sub = _subparser(parser, command)
    flags = [o for o in sub._option_string_actions if o.startswith("--")]
    for extra in extras:
        if extra.startswith("-") and extra != "-":
            name = extra.split("=", 1)[0]
            print(f"tandem {command}: unknown flag {name}{_closest(name, flags)} (tandem {command} --help lists "
                  "the flags)", file=sys.stderr)
        else:
            print(f"tandem {command}: unexpected argument {extra!r} (a prompt with spaces needs quotes; tandem "
                  f"{command} --help shows the usage)", file=sys.stderr)
        return 2
    return 2


def _normalise_addresses(args) -> None:
    from tandem.flags import service_address

    for attr, service in ADDRESS_FLAGS.get(args.command, {}).items():
        value = getattr(args, attr, None)
        if value and value != "local":              # serve-gateway --verifier local: no address
            setattr(args, attr, service_address(value, service, "--" + attr.replace("_", "-")))


def _fail(command: str | None, exc: BaseException, code: int, hint: str = "") -> int:
    """One line for an error the user can act on; the traceback only with TANDEM_DEBUG=1."""
    if os.environ.get("TANDEM_DEBUG", "").lower() in ("1", "true", "yes", "on"):
        raise exc
    prefix = f"tandem {command}" if command else "tandem"
    print(f"{prefix}: error: {exc}{hint}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    # gRPC's C core logs each failed TLS handshake at INFO; the clients here explain failures themselves
    # (tandem.health). GRPC_VERBOSITY=INFO brings those lines back.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    if command is None and argv and not argv[0].startswith("-"):
        return _unknown_command(argv[0])
    parser = build_parser(only=command if command else NO_COMMAND)
    args, extras = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if extras:
        return _unknown_arguments(parser, args.command, extras)
    try:
        _normalise_addresses(args)
    except ValueError as exc:
        return _fail(args.command, exc, 2)
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
    except (FileNotFoundError, ValueError) as exc:       # bad flags, missing files, a TLS mismatch
        return _fail(args.command, exc, 2)
    except (ConnectionError, TimeoutError) as exc:       # a peer that cannot be reached (tandem.health.Unreachable)
        return _fail(args.command, exc, 1)
    except Exception as exc:
        import grpc

        if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):   # e.g. the verifier refused our token
            print(f"tandem {args.command}: error: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
        if type(exc) is RuntimeError or type(exc).__module__.startswith("tandem"):
            # a start-up failure explained in its message (tandem up: a child exited); bugs keep their traceback
            return _fail(args.command, exc, 1, " (TANDEM_DEBUG=1 shows the traceback)")
        raise
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
