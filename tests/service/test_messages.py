"""The first hour: what the launcher says when something is wrong. Each message is checked
through the real `tandem` CLI (a subprocess, or tandem.cli.main with capsys): one line, the flag and the
fix, no traceback; TLS mismatches between real processes on loopback."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import LoopThread
from procs import ServiceProcess, free_port
from tandem import security
from tandem.cli import main

REPO = Path(__file__).resolve().parents[2]


def tandem(*args, input=None, timeout=120, env=None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("TANDEM_", "OTEL_"))}
    full_env.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", "tandem.cli", *args], input=input, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env=full_env)


def one_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert "Traceback" not in text, text
    return lines[-1]


@pytest.fixture(autouse=True)
def _keep_security():
    with security.using(security.default()):     # main() sets the process default from the flags
        yield


@pytest.fixture
def clean_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith("TANDEM_"):
            monkeypatch.delenv(k)


# ---- a target that does not exist ---------------------------------------------------------------------
def test_serve_verifier_with_a_missing_target_says_which_flag():
    r = tandem("serve-verifier", "--target", "/nope/model", "--port", "0")
    assert r.returncode == 2
    line = one_line(r.stderr)
    assert line.startswith("tandem serve-verifier: error: --target /nope/model: no such file or directory")
    assert "'default'" in line and ".gguf" in line and "Hugging Face model directory" in line


def test_up_with_a_missing_target_ends_without_a_traceback():
    r = tandem("up", "--target", "/nope/model", "--gateway-port", str(free_port()), "--http-port", "-1", timeout=180)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr, r.stderr
    assert "--target /nope/model: no such file or directory" in r.stderr


# ---- connection refused ---------------------------------------------------------------------------------
def test_generate_on_a_closed_port_says_cannot_reach(capsys, clean_env):
    port = free_port()
    assert main(["generate", "--gateway", f"127.0.0.1:{port}", "hi", "--timeout", "5"]) == 1
    err = capsys.readouterr().err
    assert one_line(err) == (f"tandem generate: cannot reach the gateway at 127.0.0.1:{port} (connection refused): "
                             "is `tandem up` (or `tandem serve-gateway`) running on that port?")


def test_health_on_a_closed_port_says_cannot_reach(capsys, clean_env):
    port = free_port()
    assert main(["health", f"127.0.0.1:{port}", "--service", "drafter"]) == 1
    assert one_line(capsys.readouterr().err) == (
        f"127.0.0.1:{port}: UNAVAILABLE: cannot reach the drafter at 127.0.0.1:{port} (connection refused): is "
        "`tandem serve-drafter` running on that port?")


# ---- addresses without a port ---------------------------------------------------------------------------
def test_an_address_without_a_port_gets_the_services_default():
    from tandem.flags import address, service_address

    assert address("localhost", 50051) == "localhost:50051"
    assert address("gpu-box.lan:6000", 50051) == "gpu-box.lan:6000"
    assert address("::1", 50061) == "[::1]:50061" and address("[::1]", 50061) == "[::1]:50061"
    assert address("[::1]:7", 50061) == "[::1]:7"
    assert address("", 50061) == "" and address("unix:/tmp/s", 1) == "unix:/tmp/s"
    with pytest.raises(ValueError, match="the port must be a number"):
        address("host:http", 50051)
    assert service_address("drafter-box.lan", "drafter", "--drafter") == "drafter-box.lan:50061"
    with pytest.raises(ValueError, match="looks like a model or folder"):
        service_address("/models/drafter", "drafter", "--drafter")


def test_serve_gateway_refuses_a_drafter_folder_as_the_drafter_address(capsys, clean_env):
    assert main(["serve-gateway", "--drafter", "default"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("tandem serve-gateway: error: --drafter 'default' looks like a model or folder")
    assert "TANDEM_DRAFTER" in line


def test_generate_and_health_dial_the_default_port(capsys, clean_env):
    port_note = "localhost:50051"
    with socket.socket() as probe:          # only meaningful where nothing listens on 50051
        if probe.connect_ex(("127.0.0.1", 50051)) == 0:
            pytest.skip("something listens on 50051 here")
    assert main(["generate", "--gateway", "localhost", "hi", "--timeout", "5"]) == 1
    assert f"the gateway at {port_note} (connection refused)" in capsys.readouterr().err
    assert main(["health"]) == 1                                   # no address: the local gateway
    assert "cannot reach the gateway at 127.0.0.1:50051 (connection refused)" in capsys.readouterr().err


# ---- the wrong service at an address --------------------------------------------------------------------
def test_health_names_what_a_server_serves_instead(capsys, clean_env):
    from tandem.serving import start_service

    lt = LoopThread()
    try:
        service = lt.run(start_service("gateway", lambda s: None, ["tandem.v1.Gateway"], "127.0.0.1", 0))
        addr = f"127.0.0.1:{service.port}"
        assert main(["health", addr, "--service", "drafter"]) == 1
        assert one_line(capsys.readouterr().err) == (
            f"{addr}: NOT_FOUND: the server at {addr} does not serve tandem.v1.Drafter (it serves: tandem.v1.Gateway)")
        assert main(["health", addr, "--service", "gateway"]) == 0
        assert capsys.readouterr().out.strip() == f"{addr}: SERVING"
        lt.run(service.stop(0))
    finally:
        lt.close()


# ---- typos, help, version ---------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["generate", "--max-token", "3", "hi"],
     "tandem generate: unknown flag --max-token; did you mean --max-tokens? (tandem generate --help lists the flags)"),
    (["generate", "--temprature=0.5", "hi"], "tandem generate: unknown flag --temprature; did you mean --temperature?"),
    (["generat", "hi"], "tandem: unknown command 'generat'; did you mean generate? (tandem --help lists the commands)"),
    (["generate", "two", "words"], "tandem generate: unexpected argument 'words' (a prompt with spaces needs quotes"),
])
def test_a_typo_gets_a_suggestion(argv, message, capsys, clean_env):
    assert main(argv) == 2
    assert one_line(capsys.readouterr().err).startswith(message)


@pytest.mark.parametrize("argv", [["--help"], ["generate", "--help"], ["health", "--help"]])
def test_help_has_no_rest_markup(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "usage: tandem" in out and "``" not in out
    if argv == ["--help"]:
        assert "TANDEM_* environment variable" in out


def test_version(capsys):
    from importlib import metadata

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"tandem {metadata.version('tandem-spec')}"
    r = tandem("--version")
    assert r.returncode == 0 and r.stdout.startswith("tandem 0.")


# ---- the prompt from stdin or a file --------------------------------------------------------------------
def test_prompt_from_stdin_or_a_file(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from tandem.generate import read_prompt

    class Pipe(io.StringIO):
        def isatty(self):
            return False

    monkeypatch.setattr(sys, "stdin", Pipe("from stdin\n"))
    assert read_prompt(SimpleNamespace(prompt="-", prompt_file=None)) == "from stdin\n"
    f = tmp_path / "p.txt"
    f.write_text("from a file")
    assert read_prompt(SimpleNamespace(prompt=None, prompt_file=str(f))) == "from a file"
    assert read_prompt(SimpleNamespace(prompt="plain")) == "plain"            # tandem demo passes no prompt_file
    with pytest.raises(ValueError, match="either as an argument or with --prompt-file"):
        read_prompt(SimpleNamespace(prompt="x", prompt_file=str(f)))
    with pytest.raises(FileNotFoundError, match="--prompt-file"):
        read_prompt(SimpleNamespace(prompt=None, prompt_file=str(tmp_path / "none")))


def test_generate_reads_stdin_and_says_when_there_is_no_prompt():
    port = free_port()
    r = tandem("generate", "-", "--gateway", f"127.0.0.1:{port}", "--timeout", "5", input="Hi there\n")
    assert r.returncode == 1 and "cannot reach the gateway" in one_line(r.stderr)    # read, then sent
    r = tandem("generate", "--gateway", f"127.0.0.1:{port}")
    assert r.returncode == 2
    assert one_line(r.stderr).startswith("tandem generate: error: no prompt: give it as an argument")


# ---- TLS on one side only ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    from tandem.security import make_certs

    out = tmp_path_factory.mktemp("certs")
    make_certs(out, ["node"])
    return out


@pytest.fixture(scope="module")
def verifiers(tiny_target_dir, certs, tmp_path_factory):
    """Two verifiers as real processes on loopback: plaintext and TLS."""
    logs = tmp_path_factory.mktemp("logs")
    env = {"TANDEM_THREADS": "1"}
    plain = ServiceProcess("verifier", ["--target", str(tiny_target_dir), "--port", "0"], logs, name="plain", env=env)
    tls = ServiceProcess("verifier", ["--target", str(tiny_target_dir), "--port", "0", "--tls-cert",
                                      str(certs / "node.pem"), "--tls-key", str(certs / "node.key")], logs,
                         name="tls", env=env)
    try:
        yield f"127.0.0.1:{plain.wait_port(120)}", f"127.0.0.1:{tls.wait_port(120)}"
    finally:
        plain.close()
        tls.close()


def test_gateway_with_tls_ca_and_a_plaintext_verifier_fails_fast(verifiers, certs):
    plain, _ = verifiers
    t0 = time.monotonic()
    r = tandem("serve-gateway", "--verifier", plain, "--drafter", "", "--port", "0", "--tls-ca",
               str(certs / "ca.pem"), timeout=60)
    took = time.monotonic() - t0
    assert r.returncode == 2
    assert one_line(r.stderr) == (
        f"tandem serve-gateway: error: the verifier at {plain} does not speak TLS, but --tls-ca turns TLS on for "
        "outgoing calls: start the verifier with --tls-cert/--tls-key, or drop --tls-ca")
    assert "WRONG_VERSION_NUMBER" not in r.stderr
    assert took < 20, took


def test_plaintext_gateway_and_a_tls_verifier_fails_fast(verifiers):
    _, tls = verifiers
    t0 = time.monotonic()
    r = tandem("serve-gateway", "--verifier", tls, "--drafter", "", "--port", "0", timeout=60)
    assert r.returncode == 2
    assert one_line(r.stderr) == (
        f"tandem serve-gateway: error: the verifier at {tls} speaks TLS, but this gateway has no --tls-ca: give "
        "--tls-ca (the ca.pem from `tandem certs`), or start the verifier without --tls-cert/--tls-key")
    assert time.monotonic() - t0 < 20


def test_health_names_a_tls_mismatch(verifiers, certs, capsys, clean_env):
    plain, tls = verifiers
    assert main(["health", plain, "--tls-ca", str(certs / "ca.pem")]) == 1
    assert "does not speak TLS, but --tls-ca turns TLS on" in one_line(capsys.readouterr().err)
    assert main(["health", tls]) == 1
    assert "speaks TLS, but this client has no --tls-ca" in one_line(capsys.readouterr().err)
    assert main(["health", tls, "--tls-ca", str(certs / "ca.pem")]) == 0
