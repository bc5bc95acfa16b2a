"""Flags with matching ``TANDEM_*`` environment variables (``--gateway-port`` <-> ``TANDEM_GATEWAY_PORT``;
flags win), and the flag groups several commands share (TLS and the token, a server's listening address).
Each service declares its own flags in its own ``cli`` module with these helpers."""

from __future__ import annotations

import argparse
import os

DEFAULT_HOST = "127.0.0.1"
# The port each service listens on by default: an address flag given without a port gets its service's.
DEFAULT_PORTS = {"gateway": 50051, "drafter": 50061, "verifier": 50062}


def address(value: str | None, default_port: int) -> str | None:
    """``host:port`` from an address flag's value, with ``default_port`` where it names no port
    (``localhost`` -> ``localhost:50051``; gRPC would otherwise dial 443). IPv6 literals get brackets
    (``::1`` -> ``[::1]:50051``); ``unix:`` / ``dns:`` and other gRPC target URIs pass unchanged, as do
    '' and None (no address). Raises ValueError on a port that is not a number in 1..65535."""
    if value is None:
        return None
    value = value.strip()
    if not value or "://" in value or value.startswith(("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:",
                                                         "vsock:")):
        return value
    if value.startswith("["):                                   # [v6] or [v6]:port
        host, _, rest = value[1:].partition("]")
        if not rest:
            return f"[{host}]:{default_port}"
        if not rest.startswith(":"):
            raise ValueError(f"bad address {value!r}: expected [IPv6]:PORT")
        port = rest[1:]
    elif value.count(":") > 1:                                  # a bare IPv6 literal
        return f"[{value}]:{default_port}"
    elif ":" in value:
        host, _, port = value.rpartition(":")
        if not host:
            raise ValueError(f"bad address {value!r}: expected HOST:PORT, e.g. 127.0.0.1:{default_port}")
    else:
        return f"{value}:{default_port}"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad address {value!r}: the port must be a number 1-65535, e.g. "
                         f"{value.rsplit(':', 1)[0]}:{default_port}")
    return value


def service_address(value: str | None, service: str, flag_name: str) -> str | None:
    """``address`` for a flag naming where ``service`` (gateway, drafter, verifier) listens, with the flag in
    the error; refuses a model folder given where an address belongs (``TANDEM_DRAFTER`` is a folder to
    serve-drafter and up, but host:port to serve-gateway)."""
    if value and (value == "default" or "/" in value.split("://", 1)[-1]) and not value.startswith("unix"):
        raise ValueError(f"{flag_name} {value!r} looks like a model or folder, but here it is the {service} "
                         f"service's address host:port (e.g. 127.0.0.1:{DEFAULT_PORTS[service]}); "
                         f"{env_name(flag_name.lstrip('-'))} means a folder to serve-{service} and up, an address to "
                         "serve-gateway: set it per service")
    try:
        return address(value, DEFAULT_PORTS[service])
    except ValueError as exc:
        raise ValueError(f"{flag_name}: {exc}") from None


def env_name(name: str) -> str:
    return "TANDEM_" + name.upper().replace("-", "_")


def env(name: str, default=None, cast=str):
    """Default for a flag from TANDEM_<NAME>, else ``default``."""
    value = os.environ.get(env_name(name))
    if value is None:
        return default
    if cast is bool:
        return value.lower() in ("1", "true", "yes", "on")
    return cast(value)


def flag(parser: argparse.ArgumentParser, name: str, default=None, cast=str, help: str = "", **kw) -> None:
    envvar = env_name(name)
    if cast is bool:
        parser.add_argument("--" + name, action="store_true", default=env(name, False, bool),
                            help=f"{help} [env {envvar}]", **kw)
    else:
        parser.add_argument("--" + name, type=cast, default=env(name, default, cast),
                            help=f"{help} [env {envvar}; default {default}]", **kw)


def security_flags(p: argparse.ArgumentParser, server: bool) -> None:
    """TLS and the bearer token (tandem.security)."""
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


def write_port_file(path, port: int) -> None:
    """Writes ``--port-file``: whole or not at all (a temporary file renamed over it), so whoever waits for the
    file to exist never reads it empty."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, path)


def server_flags(p: argparse.ArgumentParser, port_default: int) -> None:
    """What every serve-* command has: where to listen, graceful stop, CPU pinning, TLS, metrics."""
    flag(p, "host", DEFAULT_HOST, help="address to listen on (loopback by default; any other needs TLS or "
         "--insecure)")
    flag(p, "port", port_default, int, help="port to listen on (0 picks a free one)")
    flag(p, "port-file", None, help="write the bound port to this file once listening")
    flag(p, "grace", 5.0, float, help="seconds in-flight calls get to finish on SIGTERM/SIGINT")
    flag(p, "cpus", None, help="pin this service to these CPUs, e.g. '1' or '0-3,6' (Linux; unset: all)")
    security_flags(p, server=True)
    flag(p, "metrics-port", None, int, help="serve Prometheus metrics on http://HOST:PORT/metrics (unset: off; "
         "0: a free port). Tracing: set OTEL_EXPORTER_OTLP_ENDPOINT (see deploy/TRACING.md)")


def draft_length(value: str) -> int:
    """A draft-length flag: 'auto' -> 0 (chosen every round from measured costs; on the wire, "the gateway's
    default"); N >= 1 -> N (pinned)."""
    if str(value).strip().lower() in ("auto", "0", ""):
        return 0
    k = int(value)
    if k < 1:
        raise ValueError("the draft length is 'auto' or a number >= 1")
    return k
