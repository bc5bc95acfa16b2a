"""The verifier sets libgomp's busy-wait before torch loads libgomp (``--omp-spincount``)."""
from __future__ import annotations

import os
import subprocess
import sys

import torch  # noqa: F401 - loaded, as in the test process: too late to set libgomp's spin count

from verifier_service.cli import openmp_environment

SCRIPT = """
import os, sys
from tandem.cli import build_parser
from verifier_service.cli import openmp_environment
args = build_parser(only="serve-verifier").parse_args(["serve-verifier", *sys.argv[1:]])
assert "torch" not in sys.modules, "torch loaded before the verifier's flags were read"
said = openmp_environment(args.omp_spincount)
import torch                                            # libgomp reads GOMP_SPINCOUNT now
print(os.environ.get("GOMP_SPINCOUNT"), "|", said)
"""


def _serve_verifier_env(*argv: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
             and not k.startswith("TANDEM_")}
    out = subprocess.run([sys.executable, "-c", SCRIPT, *argv], env={**clean, **env}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_the_default_spin_count_is_set_before_torch_loads():
    assert _serve_verifier_env() == "10000 | GOMP_SPINCOUNT=10000"
    assert _serve_verifier_env("--omp-spincount", "50000") == "50000 | GOMP_SPINCOUNT=50000"
    assert _serve_verifier_env(TANDEM_OMP_SPINCOUNT="2000") == "2000 | GOMP_SPINCOUNT=2000"
    assert _serve_verifier_env("--omp-spincount", "-1") == "None | libgomp's default"


def test_the_environment_wins():
    assert _serve_verifier_env(GOMP_SPINCOUNT="7") == "7 | GOMP_SPINCOUNT=7 (from the environment)"
    assert _serve_verifier_env(OMP_WAIT_POLICY="active") == "None | OMP_WAIT_POLICY=active (from the environment)"


def test_too_late_once_torch_is_loaded():
    environ: dict[str, str] = {}
    assert openmp_environment(10_000, environ).endswith("(torch was loaded before the verifier's flags were read)")
    assert environ == {}
