"""``tandem health HOST:PORT``: ask a service's gRPC health endpoint (no token needed; TLS when --tls-ca is
given). Exit code 0 when SERVING, 1 otherwise: usable from compose, systemd, scripts and by hand."""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVICES = {"": "", "gateway": "tandem.v1.Gateway", "verifier": "tandem.v1.Verifier", "drafter": "tandem.v1.Drafter"}


def configure(p) -> None:
    from tandem.flags import flag, security_flags

    p.add_argument("address", help="host:port of a drafter, verifier or gateway")
    p.add_argument("--service", default="", help="a service name to ask about (gateway, verifier, drafter or a "
                   "full name such as tandem.v1.Drafter); default: the server as a whole")
    flag(p, "timeout", 5.0, float, help="seconds to wait for the answer")
    security_flags(p, server=False)


def check(address: str, service: str = "", timeout: float = 5.0, security=None) -> str:
    """The serving status's name (SERVING, NOT_SERVING, ...); raises grpc.RpcError when unreachable."""
    from tandem import security as sec

    security = security or sec.default()
    with security.sync_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=SERVICES.get(service, service)), timeout=timeout)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def run(args) -> int:
    try:
        status = check(args.address, args.service, args.timeout)
    except grpc.RpcError as err:
        print(f"{args.address}: {err.code().name}: {err.details()}", file=sys.stderr)
        return 1
    print(f"{args.address}: {status}")
    return 0 if status == "SERVING" else 1
