"""TLS, mutual TLS and the shared token: the three services over real gRPC on loopback with tiny models,
called with right and wrong credentials; ``tandem certs``; plaintext refused off loopback."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness import LoopThread
from tandem import security
from tandem.pb import common_pb2, drafter_grpc, gateway_grpc, gateway_pb2
from tandem.security import Security, make_certs

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    good = tmp_path_factory.mktemp("certs")
    make_certs(good, ["node"], client="laptop")
    other = tmp_path_factory.mktemp("other_ca")          # a different CA: its certificates must not be trusted
    make_certs(other, ["node"], client="laptop")
    return good, other


class SecureStack:
    """Verifier + drafter + gateway in this process, all under one Security (TLS, token, maybe mTLS)."""

    def __init__(self, target, drafter, sec: Security):
        from drafter_service.server import start_drafter
        from gateway.engine import GatewayConfig
        from gateway.server import connect_gateway, start_gateway
        from verifier_service.server import start_verifier

        self.lt = LoopThread()
        with security.using(sec):
            self.services = [self.lt.run(start_verifier(target)), self.lt.run(start_drafter(drafter))]
            v, d = (f"localhost:{s.port}" for s in self.services)
            self.gateway = self.lt.run(connect_gateway(v, d, GatewayConfig(draft_length=3, max_tokens_limit=64),
                                                       wait_s=30))
            self.services.append(self.lt.run(start_gateway(self.gateway)))
        self.drafter_addr = d
        self.gateway_addr = f"localhost:{self.services[-1].port}"

    def close(self):
        for s in reversed(self.services):
            self.lt.run(s.stop(0))
        self.lt.run(self.gateway.verifier.close())
        self.lt.run(self.gateway.drafter.close())
        self.lt.close()


def creds(ca=None, cert=None, key=None):
    read = lambda p: p.read_bytes() if p else None  # noqa: E731
    return grpc.ssl_channel_credentials(read(ca), read(key), read(cert))


def generate(address, credentials=None, metadata=(), timeout=30):
    channel = grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
    with channel:
        return gateway_grpc.GatewayStub(channel).Generate(
            gateway_pb2.GenerateRequest(prompt="w1 w2 w3", max_tokens=8, ignore_eos=True), timeout=timeout,
            metadata=metadata)


def error_of(fn):
    with pytest.raises(grpc.RpcError) as err:
        fn()
    return err.value


BEARER = (("authorization", f"Bearer {TOKEN}"),)


@pytest.fixture(scope="module")
def tls_stack(tiny_target_dir, tiny_drafter_onnx, certs):
    from drafter_service.onnx_drafter import OnnxDrafter
    from verifier_service.target import Target

    good, _ = certs
    sec = Security(tls_cert=str(good / "node.pem"), tls_key=str(good / "node.key"), tls_ca=str(good / "ca.pem"),
                   token=TOKEN)
    s = SecureStack(Target.load(str(tiny_target_dir)), OnnxDrafter(tiny_drafter_onnx, threads=1), sec)
    yield s
    s.close()


def test_tls_and_token_right_credentials(tls_stack, certs):
    good, _ = certs
    reply = generate(tls_stack.gateway_addr, creds(good / "ca.pem"), BEARER)
    assert len(reply.token_ids) == 8
    assert reply.stats.speculative and reply.stats.proposed > 0      # gateway -> drafter/verifier: TLS + token too


def test_missing_and_wrong_token_are_unauthenticated(tls_stack, certs):
    good, _ = certs
    err = error_of(lambda: generate(tls_stack.gateway_addr, creds(good / "ca.pem")))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "missing token" in err.details()
    err = error_of(lambda: generate(tls_stack.gateway_addr, creds(good / "ca.pem"),
                                    (("authorization", "Bearer nope"),)))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "invalid token" in err.details()
    err = error_of(lambda: generate(tls_stack.gateway_addr, creds(good / "ca.pem"),
                                    (("authorization", TOKEN),)))              # no "Bearer " scheme
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    # node-to-node APIs check it too
    with grpc.secure_channel(tls_stack.drafter_addr, creds(good / "ca.pem")) as ch:
        err = error_of(lambda: drafter_grpc.DrafterStub(ch).GetInfo(common_pb2.GetInfoRequest(), timeout=10))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        assert drafter_grpc.DrafterStub(ch).GetInfo(common_pb2.GetInfoRequest(), timeout=10,
                                                    metadata=BEARER).vocab_size == 64


def test_health_is_open_without_token(tls_stack, certs):
    good, _ = certs
    with grpc.secure_channel(tls_stack.gateway_addr, creds(good / "ca.pem")) as ch:
        status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10).status
    assert status == health_pb2.HealthCheckResponse.SERVING


def test_plaintext_or_untrusted_ca_cannot_connect(tls_stack, certs):
    _, other = certs
    err = error_of(lambda: generate(tls_stack.gateway_addr, None, BEARER, timeout=5))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    err = error_of(lambda: generate(tls_stack.gateway_addr, creds(other / "ca.pem"), BEARER, timeout=5))
    assert err.code() == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_requires_a_client_certificate_from_the_ca(tiny_target_dir, tiny_drafter_onnx, certs):
    from drafter_service.onnx_drafter import OnnxDrafter
    from verifier_service.target import Target

    good, other = certs
    sec = Security(tls_cert=str(good / "node.pem"), tls_key=str(good / "node.key"), tls_ca=str(good / "ca.pem"),
                   tls_client_auth=True, token=TOKEN)
    s = SecureStack(Target.load(str(tiny_target_dir)), OnnxDrafter(tiny_drafter_onnx, threads=1), sec)
    try:
        ok = generate(s.gateway_addr, creds(good / "ca.pem", good / "laptop.pem", good / "laptop.key"), BEARER)
        assert len(ok.token_ids) == 8 and ok.stats.speculative    # the gateway's node cert works as a client cert
        err = error_of(lambda: generate(s.gateway_addr, creds(good / "ca.pem"), BEARER, timeout=5))
        assert err.code() == grpc.StatusCode.UNAVAILABLE          # no client certificate
        err = error_of(lambda: generate(s.gateway_addr, creds(good / "ca.pem", other / "laptop.pem",
                                                              other / "laptop.key"), BEARER, timeout=5))
        assert err.code() == grpc.StatusCode.UNAVAILABLE          # a client certificate from another CA
    finally:
        s.close()


def test_tandem_generate_sends_tls_and_token(tls_stack, certs, capsys, monkeypatch):
    from tandem.cli import main

    good, _ = certs
    base = ["generate", "w1 w2", "--gateway", tls_stack.gateway_addr, "--max-tokens", "4", "--ignore-eos",
            "--tls-ca", str(good / "ca.pem"), "--json"]
    with security.using(security.default()):                      # main() sets the process default
        monkeypatch.setenv("TANDEM_TOKEN", TOKEN)
        assert main(base) == 0
        assert '"new_tokens": 4' in capsys.readouterr().out
        monkeypatch.setenv("TANDEM_TOKEN", "wrong")
        assert main(base) == 1
        assert "UNAUTHENTICATED" in capsys.readouterr().err


def test_gateway_with_a_wrong_drafter_token_falls_back_to_the_target(tiny_target_dir, tiny_drafter_onnx):
    """A drafter that refuses the gateway is treated as down: requests still complete, target only."""
    from drafter_service.onnx_drafter import OnnxDrafter
    from drafter_service.server import start_drafter
    from gateway.engine import GatewayConfig
    from gateway.server import connect_gateway, start_gateway
    from verifier_service.server import start_verifier
    from verifier_service.target import Target

    lt = LoopThread()
    try:
        with security.using(Security(token="right")):
            verifier = lt.run(start_verifier(Target.load(str(tiny_target_dir))))
            gw_service = None
        with security.using(Security(token="other")):
            drafter = lt.run(start_drafter(OnnxDrafter(tiny_drafter_onnx, threads=1)))
        with security.using(Security(token="right")):
            gw = lt.run(connect_gateway(f"127.0.0.1:{verifier.port}", f"127.0.0.1:{drafter.port}",
                                        GatewayConfig(max_tokens_limit=64), wait_s=30))
            gw_service = lt.run(start_gateway(gw))
        reply = generate(f"127.0.0.1:{gw_service.port}", None, (("authorization", "Bearer right"),))
        assert len(reply.token_ids) == 8 and not reply.stats.speculative
        assert "UNAUTHENTICATED" in reply.stats.fallback_reason
    finally:
        for s in (gw_service, drafter, verifier):
            if s is not None:
                lt.run(s.stop(0))
        lt.close()


def test_plaintext_is_refused_off_loopback():
    with pytest.raises(ValueError, match="refusing to listen on 0.0.0.0 without TLS"):
        Security().check_listen("0.0.0.0", "drafter")
    with pytest.raises(ValueError, match="without TLS"):
        Security(token="t").check_listen("192.168.1.20", "drafter")    # a token does not replace TLS
    for host in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"):
        Security().check_listen(host, "drafter")
    Security(insecure=True).check_listen("0.0.0.0", "drafter")         # allowed, with a warning
    Security(tls_cert="c.pem", tls_key="k.pem").check_listen("0.0.0.0", "drafter")


def test_serve_refuses_non_loopback_without_tls(tiny_drafter_onnx, capsys):
    from tandem.cli import main

    with security.using(security.default()):
        code = main(["serve-drafter", "--drafter", str(tiny_drafter_onnx), "--host", "0.0.0.0", "--port", "0"])
    assert code == 2 and "refusing to listen on 0.0.0.0 without TLS" in capsys.readouterr().err


def test_bad_tls_settings_say_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="tandem certs"):
        Security(tls_cert=str(tmp_path / "no.pem"), tls_key=str(tmp_path / "no.key")).server_credentials()
    with pytest.raises(ValueError, match="both --tls-cert and --tls-key"):
        Security(tls_cert=str(tmp_path / "no.pem")).server_credentials()
    with pytest.raises(ValueError, match="needs --tls-ca"):
        make_certs(tmp_path, ["n"], client=None)
        Security(tls_cert=str(tmp_path / "n.pem"), tls_key=str(tmp_path / "n.key"),
                 tls_client_auth=True).server_credentials()


def test_certs_command_makes_a_ca_and_node_certificates(tmp_path, capsys):
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    from tandem.cli import main

    assert main(["certs", "--out", str(tmp_path), "--hosts", "gpu-box=gpu-box.lan,192.168.1.10",
                 "drafter-box=198.18.0.1"]) == 0
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.pem").read_bytes())
    node = x509.load_pem_x509_certificate((tmp_path / "drafter-box.pem").read_bytes())
    assert node.issuer == ca.subject
    node.verify_directly_issued_by(ca)
    sans = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "drafter-box" in sans.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["198.18.0.1", "127.0.0.1"]
    usage = node.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usage)
    assert (tmp_path / "client.pem").exists() and oct((tmp_path / "drafter-box.key").stat().st_mode)[-3:] == "600"
    # a second run adds a host under the same CA
    assert main(["certs", "--out", str(tmp_path), "--hosts", "laptop", "--client", ""]) == 0
    x509.load_pem_x509_certificate((tmp_path / "laptop.pem").read_bytes()).verify_directly_issued_by(ca)


def test_health_command_checks_a_tls_service(tls_stack, certs, capsys):
    from tandem.cli import main

    good, _ = certs
    with security.using(security.default()):
        assert main(["health", tls_stack.drafter_addr, "--tls-ca", str(good / "ca.pem")]) == 0
        assert "SERVING" in capsys.readouterr().out
        assert main(["health", tls_stack.drafter_addr, "--service", "drafter", "--tls-ca",
                     str(good / "ca.pem")]) == 0
        assert main(["health", tls_stack.drafter_addr, "--timeout", "2"]) == 1     # plaintext to a TLS port
        assert "UNAVAILABLE" in capsys.readouterr().err
