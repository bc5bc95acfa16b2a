"""deploy/gpu-check.sh and tandem.gpu_check, exercised without a GPU: the Python module's CPU dry run on the tiny
target (greedy through the verifier == HF generate, the summary), and the shell script's input checks and plan."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tandem import gpu_check, gpu_check_verifier

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "gpu-check.sh"


@pytest.fixture(scope="module")
def dry_run(tiny_target_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check_out")
    rc = gpu_check.main(["--cpu", "--target", str(tiny_target_dir), "--out", str(out), "--prompts", "2",
                         "--new-tokens", "12", "--repeats", "2"])
    return rc, out


def test_cpu_dry_run_passes_and_greedy_equals_hf_generate(dry_run):
    rc, out = dry_run
    assert rc == 0
    ver = json.loads((out / "verifier.json").read_text())
    assert ver["ok"] and ver["device"] == "cpu"
    modes = ver["modes"]
    assert "default" in modes
    if ver["gemm_switch"]:
        assert set(modes) == {"default", "mkl"}
    for m in modes.values():
        assert m["greedy_equal"], m
        assert all(p["equal"] and len(p["tokens"]) == 12 for p in m["greedy"])
        assert all(b["agrees"] for b in m["block_verify"])
        assert sorted(map(int, m["verify_ms_by_width"])) == list(range(1, 9))
        assert m["plain_step_ms"] > 0
    assert [p["tokens"] for p in modes["default"]["greedy"]] == ver["hf_reference"]


def test_summary_names_the_steps_and_the_dry_run(dry_run):
    _, out = dry_run
    md = (out / "summary.md").read_text()
    assert "**PASS**" in md and "CPU dry run" in md
    assert "torch" in md and "greedy == HF" in md
    steps = {s["name"]: s for s in gpu_check.read_steps(out)}
    assert steps["cuda"]["status"] == "skip" and steps["verifier"]["status"] == "pass"
    env = json.loads((out / "env.json").read_text())
    assert env["cuda_available"] in (True, False) and env["torch"]
    assert json.loads((out / "summary.json").read_text())["ok"] is True


def test_a_failed_step_fails_the_summary(tmp_path):
    gpu_check.record_step(tmp_path, "install", "pass", 0, 1.0, "install.log")
    gpu_check.record_step(tmp_path, "bench", "timeout", 124, 90.0, "bench.log", "killed\tafter 90s")
    ok, md = gpu_check.write_summary(tmp_path)
    assert not ok and "**FAIL**" in md and "bench" in md and "TIMEOUT" in md
    assert gpu_check.main(["--step", "summary", "--out", str(tmp_path)]) == 1


def test_the_verifier_mismatch_is_a_failure(tiny_target_dir, tmp_path, monkeypatch):
    """A wrong reference (as if HF generate and the verifier disagreed) is reported as a failure."""
    real = gpu_check_verifier.hf_greedy
    monkeypatch.setattr(gpu_check_verifier, "hf_greedy", lambda *a: [(t + 1) % 64 for t in real(*a)])
    res = gpu_check.check_verifier(str(tiny_target_dir), "cpu", n_prompts=1, new_tokens=6, repeats=1,
                                   modes=["default"])
    assert not res["ok"] and res["modes"]["default"]["greedy"][0]["first_difference"] == 0


def script(env_extra, *args, timeout=30):
    env = {k: v for k, v in os.environ.items() if k not in ("WHEELS", "TARGET", "OUT", "DEVICE", "INSTALL")}
    env.update(PYTHON=sys.executable, **env_extra)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=ROOT)


def test_the_script_validates_its_inputs_and_prints_its_plan(tiny_target_dir, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    out = tmp_path / "out"
    # no wheels folder / an empty one / a missing target / a bad device: refused before anything runs
    assert script({"TARGET": str(tiny_target_dir)}, "--plan").returncode == 2
    r = script({"WHEELS": str(wheels), "TARGET": str(tiny_target_dir)}, "--plan")
    assert r.returncode == 2 and "no .whl" in r.stderr
    (wheels / "torch-2.13.0-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
    r = script({"WHEELS": str(wheels), "TARGET": str(tmp_path / "missing.gguf")}, "--plan")
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = script({"WHEELS": str(wheels), "TARGET": str(tiny_target_dir), "DEVICE": "gpu"}, "--plan")
    assert r.returncode == 2 and "DEVICE" in r.stderr

    r = script({"WHEELS": str(wheels), "TARGET": str(tiny_target_dir), "OUT": str(out)}, "--cpu", "--plan")
    assert r.returncode == 0, r.stderr
    plan = r.stdout
    assert "CPU dry run" in plan and "cuda     skipped" in plan
    assert f'--no-index --find-links "{wheels}"' in plan
    assert "-m tandem.pb --force" in plan
    assert "--step verifier --device cpu" in plan and str(tiny_target_dir) in plan
    assert "tests/unit/test_exactness.py tests/e2e/test_default_greedy.py tests/unit/test_devices.py" in plan
    assert "tandem.cli bench" in plan and "TANDEM_DEVICE=cpu" in plan
    assert "nothing was installed or run" in plan
    assert not out.exists()                      # the plan writes nothing

    r = script({"WHEELS": str(wheels), "TARGET": str(tiny_target_dir), "DRY_RUN": "1"})
    assert r.returncode == 0 and "GPU (cuda)" in r.stdout and "--device cuda" in r.stdout
