"""The drafter node stays light: it serves with torch and transformers blocked from import."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import grpc

from tandem.pb import common_pb2, drafter_grpc, drafter_pb2

BLOCKER = textwrap.dedent("""
    import importlib.abc, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "transformers"):
                raise ImportError(f"{name} is blocked: the drafter node must not need it")
            return None

    sys.meta_path.insert(0, Block())
    from tandem.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_drafter_serves_with_torch_blocked(tiny_drafter_onnx, tmp_path):
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, "-c", BLOCKER, "serve-drafter", "--drafter", str(tiny_drafter_onnx),
                             "--port", "0", "--port-file", str(port_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, HF_HUB_OFFLINE="1"))
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, f"drafter died without torch:\n{proc.stdout.read()}"
        with grpc.insecure_channel(f"127.0.0.1:{port_file.read_text()}") as channel:
            stub = drafter_grpc.DrafterStub(channel)
            info = stub.GetInfo(common_pb2.GetInfoRequest(), timeout=10)
            assert info.vocab_size == 64
            greedy = stub.Propose(drafter_pb2.ProposeRequest(session_id="s", appended_tokens=[1, 5, 6], k=3), timeout=10)
            assert len(greedy.tokens) == 3
            sampled = stub.Propose(drafter_pb2.ProposeRequest(
                session_id="t", appended_tokens=[1, 5, 6], k=2,
                sampling=common_pb2.SamplingParams(temperature=1.0, seed=1, has_seed=True)), timeout=10)
            assert all(abs(sum(t.support_probs) - 1) < 1e-4 for t in sampled.tokens)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "blocked" not in out
