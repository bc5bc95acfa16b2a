"""Packaging: a non-editable drafter install works on its own, the extras pick the right ONNX Runtime per
platform, and importing tandem.pb never generates stubs.

The fresh-venv test builds the package from a copy of this checkout (so the checkout gets no build/ or
egg-info and the copy has no tandem/v1/: the stubs must come from the build hook), installs
``.[drafter]`` with pip (its cache reused: run after deploy/setup.sh it finds every wheel there), checks
torch is absent, and serves the shipped default drafter over gRPC with the installed stubs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Top-level names never copied into the build copy (checkout-local state, caches, build trees).
SKIP_TOP = {".git", ".venv", "build", "dist", "runs", "bench_out", ".distill_work", ".whl", ".gl",
            ".pytest_cache", "shared", ".ci"}


def _copy_source(dest: Path) -> Path:
    def ignore(folder, names):
        here = Path(folder)
        skipped = {n for n in names if n == "__pycache__" or n.endswith((".pyc", ".egg-info"))}
        if here == REPO:
            skipped |= SKIP_TOP & set(names)
        if here == REPO / "tandem":
            skipped.add("v1")
        return skipped

    shutil.copytree(REPO, dest, ignore=ignore)
    return dest


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1", **extra)
    return env


def _bin(venv: Path, name: str) -> Path:
    return venv / ("Scripts" if os.name == "nt" else "bin") / name


# ---- (a) a non-editable drafter install in a fresh virtual environment --------------------------------
CLIENT = textwrap.dedent("""
    import importlib.util, json, sys
    import grpc
    import tandem.pb
    from tandem.pb import common_pb2, drafter_grpc, drafter_pb2
    from tandem.defaults import resolve_drafter

    with grpc.insecure_channel("127.0.0.1:" + sys.argv[1]) as channel:
        stub = drafter_grpc.DrafterStub(channel)
        info = stub.GetInfo(common_pb2.GetInfoRequest(), timeout=30)
        prop = stub.Propose(drafter_pb2.ProposeRequest(session_id="s", appended_tokens=[1, 9690, 198, 2683], k=3),
                            timeout=60)
    print(json.dumps({
        "torch": importlib.util.find_spec("torch") is not None,
        "transformers": importlib.util.find_spec("transformers") is not None,
        "stubs": tandem.pb.__file__, "v1": drafter_pb2.__file__,
        "default": str(resolve_drafter("default")),
        "vocab_size": info.vocab_size, "model_name": info.model_name,
        "tokens": [t.token_id for t in prop.tokens],
        "from_lookup_field": "from_lookup" in common_pb2.DraftToken.DESCRIPTOR.fields_by_name,
    }))
""")


@pytest.mark.install
def test_non_editable_drafter_install_serves_the_default_drafter(tmp_path):
    t0 = time.monotonic()
    src = _copy_source(tmp_path / "src")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = _bin(venv, "python")
    pip = subprocess.run([str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q", f"{src}[drafter]"],
                         capture_output=True, text=True, timeout=1500, env=_clean_env(), cwd=tmp_path)
    assert pip.returncode == 0, pip.stdout[-4000:] + pip.stderr[-4000:]
    t_install = time.monotonic() - t0

    freeze = subprocess.run([str(py), "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                            check=True, env=_clean_env()).stdout
    installed = {p["name"].lower() for p in json.loads(freeze)}
    assert "torch" not in installed and "transformers" not in installed, sorted(installed)
    assert "tandem-spec" in installed and ({"onnxruntime", "onnxruntime-gpu"} & installed)

    port_file = tmp_path / "port"
    server = subprocess.Popen([str(py), "-I", "-m", "drafter_service", "--port", "0", "--port-file", str(port_file)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                              env=_clean_env())
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists() and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.poll() is None and port_file.exists(), f"drafter did not start:\n{server.stdout.read()}"
        client = subprocess.run([str(py), "-I", "-c", CLIENT, port_file.read_text().strip()], capture_output=True,
                                text=True, timeout=120, cwd=tmp_path, env=_clean_env())
        assert client.returncode == 0, client.stdout + client.stderr
        got = json.loads(client.stdout.strip().splitlines()[-1])
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=30)
    site = str(venv)
    assert not got["torch"] and not got["transformers"]
    assert got["stubs"].startswith(site) and got["v1"].startswith(site), got   # the installed package, not the checkout
    assert got["default"].startswith(site) and got["default"].endswith(
        os.path.join("drafter_service", "drafters", "smollm2-135m-instruct")), got
    assert got["from_lookup_field"]
    assert got["vocab_size"] > 0 and len(got["tokens"]) == 3, got
    assert server.returncode == 0 or server.returncode < 0, out
    print(f"\n[test_install] copy + venv + pip install .[drafter] ({sorted(installed & {'onnxruntime', 'onnxruntime-gpu'})}):"
          f" {t_install:.1f}s; total {time.monotonic() - t0:.1f}s")


# ---- (b) which ONNX Runtime each platform gets -------------------------------------------------------
PLATFORMS = {
    "linux/x86_64": ({"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"},
                     "onnxruntime-gpu"),
    "linux/aarch64": ({"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "aarch64"},
                      "onnxruntime"),
    "darwin/arm64": ({"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64"},
                     "onnxruntime"),
    "darwin/x86_64": ({"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "x86_64"},
                      "onnxruntime"),
    "win32/AMD64": ({"sys_platform": "win32", "platform_system": "Windows", "platform_machine": "AMD64"},
                    "onnxruntime-gpu"),
    "win32/ARM64": ({"sys_platform": "win32", "platform_system": "Windows", "platform_machine": "ARM64"},
                    "onnxruntime"),
}


def _extras() -> dict[str, list[str]]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


@pytest.mark.parametrize("extra", ["drafter", "verifier"])
@pytest.mark.parametrize("platform", list(PLATFORMS))
def test_extras_pick_the_onnxruntime_with_a_wheel(extra, platform):
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    overrides, expected = PLATFORMS[platform]
    env = {**default_environment(), **overrides, "extra": extra}
    chosen = [r.name for r in map(Requirement, _extras()[extra])
              if r.name.startswith("onnxruntime") and (r.marker is None or r.marker.evaluate(env))]
    assert chosen == [expected], (platform, extra, chosen)


def test_extras_carry_what_the_services_and_tests_need():
    from packaging.requirements import Requirement

    names = {extra: {Requirement(r).name for r in reqs} for extra, reqs in _extras().items()}
    assert {"fastapi", "uvicorn", "torch", "transformers"} <= names["verifier"]
    assert {"openai", "hypothesis", "selenium", "httpx", "pytest"} <= names["test"]
    assert not {"torch", "transformers"} & names["drafter"]


# ---- (c) importing tandem.pb never runs protoc ------------------------------------------------------
def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


PROBE = textwrap.dedent("""
    import json, sys
    import tandem.pb
    from tandem.pb import PACKAGE_ROOT, generate          # the generator and the root need no stubs
    out = {"file": tandem.pb.__file__, "root": str(PACKAGE_ROOT)}
    for stmt in ("from tandem.pb import drafter_pb2", "from tandem.pb import pb", "import tandem.pb_convert"):
        try:
            exec(stmt)
            out[stmt] = None
        except ImportError as exc:
            out[stmt] = str(exc)
    out["protoc_loaded"] = "grpc_tools" in sys.modules
    print(json.dumps(out))
""")


def test_importing_pb_without_stubs_raises_and_writes_nothing(tmp_path):
    root = tmp_path / "pkg"
    shutil.copytree(REPO / "tandem", root / "tandem", ignore=shutil.ignore_patterns("v1", "__pycache__"))
    before = _tree(root)
    # protos/ reachable (TANDEM_PROTO_ROOT): an import that still generated would have all it needs.
    env = _clean_env(PYTHONPATH=str(root), TANDEM_PROTO_ROOT=str(REPO / "protos"))
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=root, env=env,
                           timeout=120)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    got = json.loads(probe.stdout.strip().splitlines()[-1])
    assert got["file"] == str(root / "tandem" / "pb.py"), got
    for stmt in ("from tandem.pb import drafter_pb2", "from tandem.pb import pb", "import tandem.pb_convert"):
        assert got[stmt] and "tandem gen-protos" in got[stmt], (stmt, got[stmt])
    assert not got["protoc_loaded"]
    assert _tree(root) == before                      # no tandem/v1/, nothing else written

    # The explicit step (what `tandem gen-protos` runs) makes them; then the import works.
    gen = subprocess.run([sys.executable, "-m", "tandem.pb"], capture_output=True, text=True, cwd=root, env=env,
                         timeout=120)
    assert gen.returncode == 0, gen.stdout + gen.stderr
    assert (root / "tandem" / "v1" / "common_pb2.py").exists()
    check = subprocess.run([sys.executable, "-m", "tandem.pb", "--check"], cwd=root, env=env, timeout=120)
    assert check.returncode == 0
    ok = subprocess.run([sys.executable, "-c", "from tandem.pb import common_pb2; "
                         "print(common_pb2.DraftToken(from_lookup=True).from_lookup)"],
                        capture_output=True, text=True, cwd=root, env=env, timeout=120)
    assert ok.returncode == 0 and ok.stdout.strip() == "True", ok.stdout + ok.stderr
