"""Build hook (all metadata lives in pyproject.toml).

``build_py`` adds two things to the build tree, so a wheel / non-editable install carries them:

* the gRPC stubs ``tandem/v1/*_pb2.py`` / ``*_pb2_grpc.py``, generated from ``protos/tandem/v1/*.proto``
  by ``tandem.pb.generate`` (grpcio-tools is a build requirement);
* the shipped default drafter, ``drafters/`` copied to ``drafter_service/drafters/`` (package data;
  ``tandem.defaults`` looks there when the checkout's ``drafters/`` is absent).

An editable install (``pip install -e .``) gets neither: the checkout's ``drafters/`` is used in place and
the stubs are made by ``tandem gen-protos`` / ``python -m tandem.pb`` (deploy/setup.sh runs it).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
DRAFTERS = ROOT / "drafters"
DRAFTERS_IN_PACKAGE = Path("drafter_service") / "drafters"


def _generator():
    """tandem/pb.py loaded by path (importing it has no side effects and needs no stubs)."""
    spec = importlib.util.spec_from_file_location("_tandem_pb_build", ROOT / "tandem" / "pb.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        build_lib = Path(self.build_lib)
        out = _generator().generate(force=True, proto_root=ROOT / "protos", out_root=build_lib)
        self.announce(f"generated gRPC stubs in {out}", level=2)
        if DRAFTERS.is_dir():
            dest = build_lib / DRAFTERS_IN_PACKAGE
            if dest.exists():
                shutil.rmtree(dest)
            shutil.copytree(DRAFTERS, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))
            self.announce(f"copied the shipped drafters to {dest}", level=2)

    def get_outputs(self, include_bytecode=1):
        outputs = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            build_lib = Path(self.build_lib)
            outputs += [str(p) for p in (build_lib / "tandem" / "v1").glob("*.py")]
            outputs += [str(p) for p in (build_lib / DRAFTERS_IN_PACKAGE).rglob("*") if p.is_file()]
        return outputs


setup(cmdclass={"build_py": BuildPyWithStubs})
