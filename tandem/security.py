"""TLS (optionally mutual) and a shared bearer token for all three services and their clients.

One ``Security`` per process, built from the flags every ``serve-*`` command and ``tandem generate``
share (``--tls-cert``, ``--tls-key``, ``--tls-ca``, ``--tls-client-auth``, ``--token``, ``--insecure``;
each also a ``TANDEM_*`` variable). The same certificate serves both ends: a node certificate made
by ``tandem certs`` is valid for server and client authentication, so the gateway presents its own
certificate to the drafter and the verifier when they require client certificates (mTLS).

- Server side (``tandem.serving.start_service``): ``server_credentials()`` (None: plaintext),
  ``server_interceptors()`` (the token check), ``check_listen(host)`` (plaintext only on loopback
  unless ``--insecure``).
- Client side (``gateway.clients.open_channel``, ``tandem generate``): ``channel_credentials()``,
  ``client_interceptors()`` / ``call_metadata()`` (``authorization: Bearer <token>`` on every call).

Health checks stay open (no token) so load balancers, compose and systemd can probe a node.
"""

from __future__ import annotations

import contextlib
import datetime
import hmac
import ipaddress
import logging
import os
import socket
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

log = logging.getLogger(__name__)

AUTH_KEY = "authorization"
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)   # callable without the token


def _read(path: str | None, what: str) -> bytes | None:
    if not path:
        return None
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"{what} {p} does not exist (tandem certs --out DIR --hosts ... creates one)")
    return p.read_bytes()


@dataclass(frozen=True)
class Security:
    tls_cert: str | None = None          # PEM certificate of this node (server identity; client cert for mTLS)
    tls_key: str | None = None           # its PEM private key
    tls_ca: str | None = None            # PEM CA that signed the peers' certificates
    tls_client_auth: bool = False        # server: require client certificates signed by tls_ca (mTLS)
    token: str | None = None             # shared bearer token (checked by servers, sent by clients)
    insecure: bool = False               # allow plaintext on a non-loopback address
    tls_server_name: str | None = None   # client: expect this name in the server's certificate

    @classmethod
    def from_args(cls, args) -> "Security":
        return cls(tls_cert=getattr(args, "tls_cert", None) or None, tls_key=getattr(args, "tls_key", None) or None,
                   tls_ca=getattr(args, "tls_ca", None) or None,
                   tls_client_auth=bool(getattr(args, "tls_client_auth", False)),
                   token=getattr(args, "token", None) or None, insecure=bool(getattr(args, "insecure", False)),
                   tls_server_name=getattr(args, "tls_server_name", None) or None)

    # ---- server side -------------------------------------------------------------------------
    @property
    def server_tls(self) -> bool:
        return bool(self.tls_cert or self.tls_key)

    def server_credentials(self) -> grpc.ServerCredentials | None:
        if not self.server_tls:
            if self.tls_client_auth:
                raise ValueError("--tls-client-auth needs TLS: give --tls-cert and --tls-key as well")
            return None
        if not (self.tls_cert and self.tls_key):
            raise ValueError("TLS needs both --tls-cert and --tls-key")
        ca = _read(self.tls_ca, "CA certificate (--tls-ca)")
        if self.tls_client_auth and ca is None:
            raise ValueError("--tls-client-auth needs --tls-ca: the CA that signed the clients' certificates")
        return grpc.ssl_server_credentials([(_read(self.tls_key, "TLS key (--tls-key)"),
                                             _read(self.tls_cert, "TLS certificate (--tls-cert)"))],
                                           root_certificates=ca, require_client_auth=self.tls_client_auth)

    def server_interceptors(self) -> list:
        return [TokenInterceptor(self.token)] if self.token else []

    def check_listen(self, host: str, name: str = "service") -> None:
        """Plaintext only on loopback, unless --insecure (then a warning)."""
        if self.server_tls or is_loopback(host):
            return
        if not self.insecure:
            raise ValueError(f"{name}: refusing to listen on {host} without TLS. Give --tls-cert and --tls-key "
                             "(tandem certs makes them), bind to 127.0.0.1, or pass --insecure on a network "
                             "you trust")
        msg = (f"{name}: listening on {host} WITHOUT TLS (--insecure): anyone on the network can read the "
               f"traffic{'' if self.token else ' and call the service (no --token either)'}")
        log.warning(msg)
        print(f"[tandem] WARNING: {msg}", file=sys.stderr, flush=True)

    # ---- client side -------------------------------------------------------------------------
    @property
    def client_tls(self) -> bool:
        return bool(self.tls_ca or self.tls_cert)

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        if not self.client_tls:
            return None
        cert, key = _read(self.tls_cert, "TLS certificate (--tls-cert)"), _read(self.tls_key, "TLS key (--tls-key)")
        if bool(cert) != bool(key):
            raise ValueError("a client certificate needs both --tls-cert and --tls-key")
        return grpc.ssl_channel_credentials(root_certificates=_read(self.tls_ca, "CA certificate (--tls-ca)"),
                                            private_key=key, certificate_chain=cert)

    def channel_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.tls_server_name)] if self.tls_server_name else []

    def call_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((AUTH_KEY, f"Bearer {self.token}"),) if self.token else ()

    def client_interceptors(self) -> list:
        return token_interceptors(self.token) if self.token else []

    def sync_channel(self, address: str, options: Sequence = ()) -> grpc.Channel:
        """A blocking channel (``tandem generate``); send ``call_metadata()`` with each call."""
        creds = self.channel_credentials()
        opts = [*options, *self.channel_options()]
        return grpc.secure_channel(address, creds, options=opts) if creds else grpc.insecure_channel(address, options=opts)


# ---- the process-wide default (set once by the CLI from its flags) -------------------------------
_default = Security()


def default() -> Security:
    return _default


def set_default(security: Security) -> None:
    global _default
    _default = security


@contextlib.contextmanager
def using(security: Security) -> Iterator[Security]:
    """Temporarily makes ``security`` the default (tests build servers and clients under it)."""
    previous = default()
    set_default(security)
    try:
        yield security
    finally:
        set_default(previous)


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False          # a hostname (or 0.0.0.0 / ::): may be reachable from the network


# ---- the token --------------------------------------------------------------------------------------
def bearer_matches(header: str, token: str) -> bool:
    """Whether an ``authorization`` header value is ``Bearer <token>`` (compared in constant time); the gRPC
    services and the gateway's HTTP API check the token with this."""
    scheme, _, value = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls without ``authorization: Bearer <token>`` with UNAUTHENTICATED (health stays open)."""

    def __init__(self, token: str):
        self._token = token

    def problem(self, metadata) -> str | None:
        values = [v for k, v in (metadata or ()) if k == AUTH_KEY]
        if not values:
            return ("missing token: this service requires 'authorization: Bearer <token>' metadata "
                    "(tandem: --token or TANDEM_TOKEN)")
        value = values[0] if isinstance(values[0], str) else values[0].decode(errors="replace")
        if not bearer_matches(value, self._token):
            return "invalid token: the bearer token does not match this service's --token / TANDEM_TOKEN"
        return None

    async def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method.startswith(OPEN_METHOD_PREFIXES):
            return await continuation(handler_call_details)
        problem = self.problem(handler_call_details.invocation_metadata)
        handler = await continuation(handler_call_details)
        if problem is None or handler is None:
            return handler
        return _denying_handler(handler, problem)


def _denying_handler(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    async def deny(request_or_iterator, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kinds = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(deny, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


def _with_token(details: grpc.aio.ClientCallDetails, token: str) -> grpc.aio.ClientCallDetails:
    metadata = grpc.aio.Metadata(*[(k, v) for k, v in (details.metadata or ()) if k != AUTH_KEY])
    metadata.add(AUTH_KEY, f"Bearer {token}")
    return details._replace(metadata=metadata)


class _Token:
    def __init__(self, token: str):
        self._token = token


class TokenClientInterceptor(_Token, grpc.aio.UnaryUnaryClientInterceptor):
    """Adds ``authorization: Bearer <token>`` to the unary calls of an aio channel. grpc registers an interceptor
    for the first call kind it implements only, so each kind has its own class (``token_interceptors``)."""

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(_with_token(client_call_details, self._token), request)


class _TokenUnaryStream(_Token, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(_with_token(client_call_details, self._token), request)


class _TokenStreamStream(_Token, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return await continuation(_with_token(client_call_details, self._token), request_iterator)


def token_interceptors(token: str) -> list:
    """The bearer token on every call of an aio channel: unary, server-streaming and bidirectional calls."""
    return [TokenClientInterceptor(token), _TokenUnaryStream(token), _TokenStreamStream(token)]


# ---- tandem certs -----------------------------------------------------------------------------------
def configure_certs(p) -> None:
    p.add_argument("--out", default="tandem-certs",
                   help="folder for ca.pem, ca.key and one <name>.pem/<name>.key per host; a CA already there is "
                        "reused (default: tandem-certs)")
    p.add_argument("--hosts", nargs="+", required=True, metavar="HOST",
                   help="one certificate per host: NAME, or NAME=SAN,SAN,... (hostnames and IP addresses the "
                        "node is reached by). Each also gets localhost and 127.0.0.1. "
                        "Example: --hosts gpu-box=gpu-box.lan,192.168.1.10 drafter-box=192.168.1.20")
    p.add_argument("--client", default="client", help="also make a client certificate with this name, for "
                   "`tandem generate` against servers with --tls-client-auth ('' for none; default: client)")
    p.add_argument("--days", type=int, default=1825, help="validity of the node certificates in days (default 1825)")


def run_certs(args) -> int:
    out = Path(args.out)
    made = make_certs(out, args.hosts, client=args.client or None, days=args.days)
    for path in made:
        print(path)
    print(f"\n[tandem] copy {out / 'ca.pem'} and each host's <name>.pem/<name>.key to that host; keep "
          f"{out / 'ca.key'} private (it signs new certificates: run tandem certs again with the same --out).",
          file=sys.stderr)
    return 0


def _parse_host(spec: str) -> tuple[str, list[str]]:
    name, _, sans = spec.partition("=")
    name = name.strip()
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"bad host {spec!r}: expected NAME or NAME=SAN,SAN,...")
    names = [name] + [s.strip() for s in sans.split(",") if s.strip()]
    return name, list(dict.fromkeys(names + ["localhost", "127.0.0.1"]))


def make_certs(out: str | os.PathLike, hosts: Sequence[str], client: str | None = "client",
               days: int = 1825) -> list[Path]:
    """A CA (reused if ``out`` already holds one) and a certificate per host, valid for server and client
    authentication, with the host's names and addresses as subject alternative names. Returns the files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    made: list[Path] = []

    def write_key(path: Path, key) -> None:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        path.chmod(0o600)
        made.append(path)

    def write_cert(path: Path, cert) -> None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        made.append(path)

    ca_pem, ca_key_pem = out / "ca.pem", out / "ca.key"
    if ca_pem.exists() and ca_key_pem.exists():
        ca_cert = x509.load_pem_x509_certificate(ca_pem.read_bytes())
        ca_key = serialization.load_pem_private_key(ca_key_pem.read_bytes(), password=None)
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Tandem"),
                             x509.NameAttribute(NameOID.COMMON_NAME, f"Tandem CA ({socket.gethostname()})")])
        ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
                   .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=3650))
                   .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                   .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                content_commitment=False, key_encipherment=False,
                                                data_encipherment=False, key_agreement=False,
                                                encipher_only=False, decipher_only=False), critical=True)
                   .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
                   .sign(ca_key, hashes.SHA256()))
        write_key(ca_key_pem, ca_key)
        write_cert(ca_pem, ca_cert)

    specs = [_parse_host(h) for h in hosts]
    if client:
        specs.append(_parse_host(client))
    for name, sans in specs:
        key = ec.generate_private_key(ec.SECP256R1())
        alt = []
        for san in sans:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(san)))
            except ValueError:
                alt.append(x509.DNSName(san))
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Tandem"),
                                         x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                .issuer_name(ca_cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=days))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_agreement=True,
                                             key_cert_sign=False, crl_sign=False, content_commitment=False,
                                             data_encipherment=False, encipher_only=False, decipher_only=False),
                               critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .add_extension(x509.SubjectAlternativeName(alt), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                               critical=False)
                .sign(ca_key, hashes.SHA256()))
        write_key(out / f"{name}.key", key)
        write_cert(out / f"{name}.pem", cert)
    return made
