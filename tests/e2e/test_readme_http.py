"""README.md's HTTP examples, run as written (curl piped to jq, and the ``openai`` client) against a live
gateway on the README's port 8080: real verifier and drafter gRPC services on loopback with the tiny test
models, the HTTP API served as ``tandem up`` serves it (the target's name as the served model name, so
the examples' ``"model": "tandem"`` is a name the gateway does not serve under)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness import Stack

README = Path(__file__).resolve().parents[2] / "README.md"
PORT = 8080                     # the examples' port, as written


def http_examples() -> tuple[str, str]:
    """The curl block and the Python block of README's "HTTP API and chat page" section, verbatim."""
    text = README.read_text()
    section = text[text.index("### HTTP API and chat page"):]
    section = section[:section.index("\n### ", 1)]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    shell = [code for lang, code in blocks if lang == "bash" and "curl" in code]
    python = [code for lang, code in blocks if lang == "python" and "from openai" in code]
    assert len(shell) == 1 and len(python) == 1, blocks
    return shell[0], python[0]


@pytest.fixture(scope="module")
def gateway_on_8080(tiny_target_dir, tiny_drafter_onnx):
    from drafter_service.onnx_drafter import OnnxDrafter
    from gateway.http_api import build_app
    from gateway.http_server import serve_http
    from verifier_service.target import Target

    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", PORT))
        except OSError:
            pytest.skip(f"port {PORT}, the one README's examples call, is in use on this machine (a `tandem up` "
                        "running?): the examples cannot run as written here")
    stack = Stack(Target.load(str(tiny_target_dir)), OnnxDrafter(tiny_drafter_onnx, threads=1))
    app = build_app(stack.gateway, token=None, model_name=stack.gateway.target.model_name)
    handle = stack.lt.run(serve_http(app, "127.0.0.1", PORT))
    yield stack
    stack.lt.run(handle.stop())
    stack.close()


def test_the_curl_example_runs_as_written(gateway_on_8080):
    if shutil.which("jq") is None:
        pytest.skip("jq is not installed (.ci/run installs it; apt-get install jq)")
    shell, _ = http_examples()
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    content, _, stats = done.stdout.partition("\n{\n")          # jq -r: the text, then the tandem object
    assert content.strip() and content.strip() != "null", done.stdout
    stats = json.loads("{\n" + stats)
    assert stats["target_model"] == gateway_on_8080.gateway.target.model_name and stats["new_tokens"] > 0


def test_the_openai_example_runs_as_written(gateway_on_8080):
    _, python = http_examples()
    done = subprocess.run([sys.executable, "-c", python], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "the example printed nothing"
    assert gateway_on_8080.target.sessions.count() == 0           # the stream ended (max_tokens) and freed both
