"""Each node imports only what is its own: the drafter box serves with torch, transformers and the
offline tools (bench, distill, export) blocked from import; the verifier serves with the gateway blocked."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import grpc

from tandem.pb import common_pb2, drafter_grpc, drafter_pb2, verifier_grpc, verifier_pb2

BLOCKER = textwrap.dedent("""
    import importlib.abc, sys

    BLOCKED = tuple(sys.argv.pop(1).split(","))

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name in BLOCKED or name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"{name} is blocked: this node must not need it")
            return None

    sys.meta_path.insert(0, Block())
    from tandem.cli import main
    sys.exit(main(sys.argv[1:]))
""")
DRAFTER_BLOCKED = "torch,transformers,tandem.bench,tandem.distill,tandem.export,gateway,verifier_service"
VERIFIER_BLOCKED = "gateway,drafter_service,tandem.bench,tandem.distill"


def _serve(blocked: str, args: list[str], port_file) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", BLOCKER, blocked, *args, "--port", "0", "--port-file",
                             str(port_file)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, HF_HUB_OFFLINE="1"))
    deadline = time.monotonic() + 90
    while not port_file.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None and port_file.exists(), f"the node died with {blocked} blocked:\n{proc.stdout.read()}"
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "blocked" not in out, out


def test_drafter_serves_with_torch_and_the_offline_tools_blocked(tiny_drafter_onnx, tmp_path):
    port_file = tmp_path / "port"
    proc = _serve(DRAFTER_BLOCKED, ["serve-drafter", "--drafter", str(tiny_drafter_onnx)], port_file)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port_file.read_text()}") as channel:
            stub = drafter_grpc.DrafterStub(channel)
            info = stub.GetInfo(common_pb2.GetInfoRequest(), timeout=10)
            assert info.vocab_size == 64
            greedy = stub.Propose(drafter_pb2.ProposeRequest(session_id="s", appended_tokens=[1, 5, 6], k=3), timeout=10)
            assert len(greedy.tokens) == 3
            sampled = stub.Propose(drafter_pb2.ProposeRequest(
                session_id="t", appended_tokens=[1, 5, 6], k=2,
                sampling=common_pb2.SamplingParams(temperature=1.0)), timeout=10)
            assert all(abs(sum(t.support_probs) - 1) < 1e-4 for t in sampled.tokens)
    finally:
        _stop(proc)


def test_verifier_serves_with_the_gateway_and_the_drafter_blocked(tiny_target_dir, tmp_path):
    port_file = tmp_path / "port"
    proc = _serve(VERIFIER_BLOCKED, ["serve-verifier", "--target", str(tiny_target_dir), "--threads", "1"],
                  port_file)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port_file.read_text()}") as channel:
            stub = verifier_grpc.VerifierStub(channel)
            assert stub.GetInfo(common_pb2.GetInfoRequest(), timeout=10).model.vocab_size == 64
            first = stub.StartSession(verifier_pb2.StartSessionRequest(session_id="s", prompt_ids=[1, 5, 6]),
                                      timeout=30).first_token
            reply = stub.Verify(verifier_pb2.VerifyRequest(session_id="s", draft=[common_pb2.DraftToken(token_id=7)]),
                                timeout=30)
            assert 0 <= first < 64 and reply.accepted in (0, 1)
    finally:
        _stop(proc)
