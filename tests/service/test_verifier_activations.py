"""--activations on a real verifier process and through `tandem up`: int8 (llama.cpp's arithmetic on a GGUF
file's blocks) is chosen by the flag or TANDEM_ACTIVATIONS, or by default ('auto') for a file whose layers are
mostly 5-bit or K-quant blocks, said in the start-up line, and a bad value is an error naming the flag before
anything loads."""

import os
import subprocess
import sys

import pytest
from procs import ServiceProcess

from tiny_models import tiny_served_gguf
from verifier_service import native

pytestmark = pytest.mark.skipif(native.library() is None, reason="C kernels unavailable")


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_served_verifier_runs_int8_activations(tmp_path, how):
    path = tiny_served_gguf(tmp_path / "tiny.gguf")              # a real tokenizer: the verifier serves one
    args = ["--target", str(path), "--no-warmup", "--port", "0"]
    service = ServiceProcess("verifier", args + (["--activations", "int8"] if how == "flag" else []), tmp_path,
                             env={"TANDEM_ACTIVATIONS": "int8"} if how == "env" else None)
    try:
        service.wait_port(120)
    finally:
        service.close()
    log = service.log_path.read_text()
    assert "int8 activations (llama.cpp's arithmetic" in log, service.tail()
    assert "prefill chunks of 32 tokens" in log, service.tail()         # int8's default: short chunks, same cost


@pytest.mark.parametrize("kind, said", [("Q5_0", "int8 activations (llama.cpp's arithmetic; auto: 100% of the "
                                                  "layers' weights are Q5_0 blocks"),
                                         ("Q4_1", "fp32 activations (auto: no 5-bit or K-quant layers)")])
def test_by_default_the_files_block_types_choose(tmp_path, kind, said):
    """No --activations: a file of Q5_0 layers (which fp32 rebuilds slowly) runs int8, a Q4_1 one fp32."""
    from tandem.bench.random_gguf import write
    from tandem.models import resolve

    default = resolve("default")
    path = write(tmp_path / "tiny.gguf", arch="llama", hidden=128, heads=2, kv_heads=1, ffn=256, std=0.3,
                 kinds={"default": kind, "token_embd": "Q8_0"}, seed=3,
                 tokenizer_from=default.directory / default.gguf_file)
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_ACTIVATIONS"}
    service = ServiceProcess("verifier", ["--target", str(path), "--no-warmup", "--port", "0"], tmp_path, env=env,
                             clean_env=True)
    try:
        service.wait_port(120)
    finally:
        service.close()
    assert said in service.log_path.read_text(), service.tail()


def test_a_bad_value_names_the_flag():
    res = subprocess.run([sys.executable, "-m", "tandem.cli", "serve-verifier", "--activations", "int4", "--port", "0"],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert res.returncode == 2
    assert "--activations 'int4' (TANDEM_ACTIVATIONS): not one of fp32, int8, auto" in res.stderr


def test_up_passes_activations_to_the_verifier(monkeypatch, tmp_path):
    """`tandem up --activations int8` starts the verifier with it; a caller that does not say leaves the
    verifier's own default (its TANDEM_ACTIVATIONS) in charge."""
    from types import SimpleNamespace

    from tandem import up

    spawned = {}

    class Stop(Exception):
        pass

    def spawn(self, name, args, port=0, label=None):
        spawned[name] = list(args)
        raise Stop

    monkeypatch.setattr(up.Cluster, "spawn", spawn)
    monkeypatch.setattr(up.Cluster, "stop", lambda self, *a, **k: None, raising=False)
    base = dict(log_dir=str(tmp_path), startup_timeout=5, target="default", drafter="default", verifier_threads=1,
                drafter_threads=1, gateway_port=0, draft_length=2, draft_confidence=0.0, http_port=-1,
                separate_verifier=True)
    for extra, want in (({"activations": "int8"}, ["--activations", "int8"]), ({}, [])):
        spawned.clear()
        with pytest.raises(Stop):
            up.start_cluster(SimpleNamespace(**base, **extra))
        args = spawned["verifier"]
        assert [a for a in args if a == "--activations"] == want[:1]
        if want:
            assert args[args.index("--activations") + 1] == "int8"
