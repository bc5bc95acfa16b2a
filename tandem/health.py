"""``tandem health [HOST:PORT]``: ask a service's gRPC health endpoint (no token needed; TLS when --tls-ca is
given). Exit code 0 when SERVING, 1 otherwise: usable from compose, systemd, scripts and by hand.

Also the diagnosis every client here uses when a call cannot reach a server (``tandem generate``, the
gateway's start-up): a TCP connect says *refused* / *unknown host* / *no answer*, and a TLS ClientHello on
that connection says whether the server speaks TLS (a TLS server answers with a TLS record; a plaintext
gRPC server does not), so a TLS mismatch is named with the flag that fixes it instead of a raw handshake
error."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem.flags import DEFAULT_HOST, DEFAULT_PORTS

SERVICES = {"": "", "gateway": "tandem.v1.Gateway", "verifier": "tandem.v1.Verifier", "drafter": "tandem.v1.Drafter"}
DEFAULT_ADDRESS = f"{DEFAULT_HOST}:{DEFAULT_PORTS['gateway']}"

# What probe() finds at an address.
REFUSED, UNKNOWN_HOST, NO_ANSWER, UNREACHABLE, TLS, PLAINTEXT = (
    "connection refused", "unknown host", "no answer", "unreachable", "tls", "plaintext")


class TlsMismatch(ValueError):
    """One side speaks TLS and the other does not (the message names the node and the flag to change)."""


class Unreachable(ConnectionError):
    """A server could not be reached at all (the message says why and what to check)."""


def configure(p) -> None:
    from tandem.flags import flag, security_flags

    p.add_argument("address", nargs="?", default=DEFAULT_ADDRESS,
                   help=f"host:port of a drafter, verifier or gateway (default: the local gateway, {DEFAULT_ADDRESS}; "
                        "without a port: 50051)")
    p.add_argument("--service", default="", help="a service name to ask about (gateway, verifier, drafter or a "
                   "full name such as tandem.v1.Drafter); default: the server as a whole")
    flag(p, "timeout", 5.0, float, help="seconds to wait for each answer")
    flag(p, "wait", 0.0, float, help="keep asking for up to this many seconds until the service is SERVING (for "
         "scripts that start a service and then use it; 0: ask once)")
    flag(p, "verbose", help="for a gateway, also show what it measured: verify ms by block width, draft and "
         "network costs, acceptance estimates (the figures the automatic draft length is chosen from)", cast=bool)
    security_flags(p, server=False)


# ---- diagnosis -------------------------------------------------------------------------------------
def split_address(address: str) -> tuple[str, int]:
    """(host, port) of ``host:port`` / ``[v6]:port``; raises ValueError otherwise."""
    target = address.split("://", 1)[-1]
    for prefix in ("dns:", "ipv4:", "ipv6:"):
        target = target.removeprefix(prefix)
    if target.startswith("["):
        host, _, rest = target[1:].partition("]")
        port = rest.lstrip(":")
    else:
        host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"not a host:port address: {address!r}")
    return host, int(port)


def _client_hello(host: str) -> bytes:
    """The bytes of a TLS ClientHello (offering h2, as gRPC does), made by Python's ssl without a socket."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    try:
        ipaddress.ip_address(host)
        sni = None
    except ValueError:
        sni = host
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=sni)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def probe(address: str, timeout: float = 3.0) -> str:
    """What is at ``address``: REFUSED, UNKNOWN_HOST, NO_ANSWER, UNREACHABLE (nothing to talk to), or TLS /
    PLAINTEXT (something listens; TLS if it answers a ClientHello with a TLS record)."""
    try:
        host, port = split_address(address)
    except ValueError:
        return UNREACHABLE
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except ConnectionRefusedError:
        return REFUSED
    except socket.gaierror:
        return UNKNOWN_HOST
    except TimeoutError:
        return NO_ANSWER
    except OSError:
        return UNREACHABLE
    with sock:
        try:
            sock.sendall(_client_hello(host))
            first = sock.recv(5)
        except OSError:                     # reset or no answer to a ClientHello: not a TLS server
            first = b""
    # A TLS record: content type handshake (22) or alert (21), then protocol version 3.x.
    return TLS if len(first) >= 2 and first[0] in (21, 22) and first[1] == 3 else PLAINTEXT


def _starting(address: str) -> str | None:
    """What a `tandem up` on this machine that will serve the gateway at ``address`` is still doing, if one is."""
    host, _, port = address.rpartition(":")
    if host.strip("[]") not in ("127.0.0.1", "localhost", "::1", "0.0.0.0") or not port.isdigit():
        return None
    from tandem.up_logs import starting_run

    return starting_run(int(port))


def _how_to_start(what: str) -> str:
    if what == "gateway":
        return "`tandem up` (or `tandem serve-gateway`)"
    return f"`tandem serve-{what}`" if what in DEFAULT_PORTS else "a tandem service"


def mismatch(what: str, address: str, found: str, client_tls: bool, node: str | None = None) -> str | None:
    """The message for a TLS mismatch between this client and what ``probe`` found, or None if they agree.
    ``node``: who is calling (e.g. 'gateway'), to name whose flags are meant."""
    if found == PLAINTEXT and client_tls:
        return (f"the {what} at {address} does not speak TLS, but --tls-ca turns TLS on for outgoing calls: "
                f"start the {what} with --tls-cert/--tls-key, or drop --tls-ca")
    if found == TLS and not client_tls:
        return (f"the {what} at {address} speaks TLS, but {'this ' + node if node else 'this client'} has no "
                f"--tls-ca: give --tls-ca (the ca.pem from `tandem certs`), or start the {what} without "
                "--tls-cert/--tls-key")
    return None


def explain(what: str, address: str, code: grpc.StatusCode | None, details: str = "", client_tls: bool = False,
            node: str | None = None, timeout: float = 3.0, security=None) -> str | None:
    """A one-line reason a call from ``node`` (default: this client) to the ``what`` (gateway, verifier,
    drafter) at ``address`` failed with ``code``, or None when it is not about reaching it (the caller then shows code and details). Decided on
    the status code and on a probe of the address (``details`` is only quoted). ``security``: the client's
    (default: the process's), to tell a failed TLS handshake from a server that answered UNAVAILABLE."""
    if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return None
    found = probe(address, timeout)
    if found == REFUSED and what == "gateway":
        starting = _starting(address)
        if starting:
            return f"cannot reach the gateway at {address} yet: {starting}; wait for its 'up:' line"
    if found in (REFUSED, UNKNOWN_HOST, NO_ANSWER, UNREACHABLE):
        hint = {REFUSED: f"is {_how_to_start(what)} running on that port?",
                UNKNOWN_HOST: "check the host name, or give its IP address",
                NO_ANSWER: "is the address right, and the port open in the firewall?",
                UNREACHABLE: "is the address right, and the machine on the network?"}[found]
        return f"cannot reach the {what} at {address} ({found}): {hint}"
    wrong = mismatch(what, address, found, client_tls, node)
    if wrong:
        return wrong
    if found == TLS and code == grpc.StatusCode.UNAVAILABLE:
        try:                                # answers: it was the server's own UNAVAILABLE (one of its nodes)
            check(address, "", timeout, security)
            return None
        except grpc.RpcError:
            pass
        return (f"TLS with the {what} at {address} failed ({details.strip() or 'handshake error'}): is its "
                "certificate signed by --tls-ca and valid for that host name (--tls-server-name overrides it), and "
                "does it require a client certificate (--tls-cert/--tls-key)?")
    return None


# ---- tandem health -----------------------------------------------------------------------------------
def check(address: str, service: str = "", timeout: float = 5.0, security=None) -> str:
    """The serving status's name (SERVING, NOT_SERVING, ...); raises grpc.RpcError when unreachable."""
    from tandem import security as sec

    security = security or sec.default()
    with security.sync_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=SERVICES.get(service, service)), timeout=timeout)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def wait_serving(address: str, service: str = "", wait: float = 0.0, timeout: float = 5.0, security=None,
                 interval: float = 0.5) -> tuple[str | None, grpc.RpcError | None]:
    """Asks ``check`` until the answer is SERVING or ``wait`` seconds have passed (0: once); each call waits at
    most ``timeout`` s. Returns (the last status name, None), or (None, the last RpcError) when unreachable."""
    end = time.monotonic() + wait
    while True:
        try:
            status, err = check(address, service, min(timeout, max(0.1, end - time.monotonic())) if wait else timeout,
                                security), None
        except grpc.RpcError as exc:
            status, err = None, exc
        if status == "SERVING" or time.monotonic() >= end:
            return status, err
        time.sleep(min(interval, max(0.0, end - time.monotonic())))


def served(address: str, timeout: float = 5.0, security=None) -> list[str]:
    """The tandem services the server at ``address`` knows (asked by name through its health service)."""
    out = []
    for name in ("tandem.v1.Gateway", "tandem.v1.Verifier", "tandem.v1.Drafter"):
        try:
            check(address, name, timeout, security)
        except grpc.RpcError:
            continue
        out.append(name)
    return out


def print_status(address: str, timeout: float) -> None:
    """A gateway's GetStatus: the drafter's state and the draft-length choice's measured costs and acceptance."""
    from tandem import security as sec
    from tandem.pb import gateway_grpc, gateway_pb2

    security = sec.default()
    with security.sync_channel(address) as channel:
        try:
            st = gateway_grpc.GatewayStub(channel).GetStatus(gateway_pb2.GetStatusRequest(), timeout=timeout,
                                                              metadata=security.call_metadata())
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                print("  (not a gateway: --verbose shows a gateway's draft-length figures)")
                return
            raise
    drafter = (f"{st.draft_model or 'up'}" if st.drafter_up else f"down ({st.drafter_down_reason or 'none configured'})")
    print(f"  target {st.target_model}; drafter {drafter}; {st.active_requests} requests in flight")
    cost = dict(st.cost_model)
    widths = sorted(int(k[len("verify_ms_w"):]) for k in cost if k.startswith("verify_ms_w"))
    print("  verify ms by block width: " + "  ".join(f"{w}: {cost[f'verify_ms_w{w}']:.1f}" for w in widths))
    print("  " + "  ".join(f"{k} {v:.2f}" for k, v in cost.items() if not k.startswith("verify_ms_w")))
    for mode, table in (("greedy", st.acceptance_greedy), ("sampled", st.acceptance_sampled)):
        # a1, a2, ... in order, then a_lookup, a_lookup_n1.., lookup_yield
        order = sorted(table, key=lambda k: (0, int(k[1:]), "") if k[1:].isdigit() else (1, 0, k))
        print(f"  acceptance ({mode}): " + "  ".join(f"{k} {table[k]:.2f}" for k in order))


def _what(service: str) -> str:
    name = SERVICES.get(service, service)
    return next((k for k, v in SERVICES.items() if k and v == name), "service")


def run(args) -> int:
    from tandem import security as sec

    from tandem.flags import address

    what = _what(args.service) if args.service else ("gateway" if args.address == DEFAULT_ADDRESS else "server")
    args.address = address(args.address, DEFAULT_PORTS.get(what, DEFAULT_PORTS["gateway"]))
    status, err = wait_serving(args.address, args.service, max(0.0, getattr(args, "wait", 0.0) or 0.0),
                               args.timeout)
    if err is None:
        print(f"{args.address}: {status}")
        if getattr(args, "verbose", False) and status == "SERVING":
            print_status(args.address, args.timeout)
        return 0 if status == "SERVING" else 1
    if err.code() == grpc.StatusCode.NOT_FOUND and args.service:
        name = SERVICES.get(args.service, args.service)
        others = served(args.address, args.timeout)
        print(f"{args.address}: NOT_FOUND: the server at {args.address} does not serve {name} (it serves: "
              f"{', '.join(others) or 'no tandem service'})", file=sys.stderr)
        return 1
    reason = explain(what, args.address, err.code(), err.details(), sec.default().client_tls)
    # "ADDR: STATUS: why", as "ADDR: SERVING" on success: scripts may match the status word
    print(f"{args.address}: {err.code().name}: {reason or err.details()}", file=sys.stderr)
    return 1
