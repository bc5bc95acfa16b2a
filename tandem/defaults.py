"""Where the default drafter comes from.

1. The drafter distilled for the default target and shipped in this repository
   (``drafters/smollm2-135m-instruct/``, made by ``tandem distill``; see its README.md). A checkout or
   editable install uses that folder in place; a wheel / non-editable install carries it as package data
   in ``drafter_service/drafters/`` (setup.py's build hook copies it there).
2. Otherwise the default target itself exported to ONNX into the user cache (acceptance near 100 %
   when greedy: an end-to-end check, not a speedup). Exporting needs torch, so it happens on first
   use on a machine that has it; a drafter-only machine is told how to get a drafter.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tandem.pb import PACKAGE_ROOT

SHIPPED_NAME = "smollm2-135m-instruct"
# Where the shipped drafters live: the checkout's drafters/ first, then the installed package data.
DRAFTER_DIRS = (PACKAGE_ROOT / "drafters", PACKAGE_ROOT / "drafter_service" / "drafters")


def shipped_drafter(name: str = SHIPPED_NAME) -> Path:
    """The shipped drafter ``name``: in the checkout's drafters/, else in the installed package data
    (the first that holds model.onnx; the checkout's path when neither does)."""
    for base in DRAFTER_DIRS:
        if (base / name / "model.onnx").exists():
            return base / name
    return DRAFTER_DIRS[0] / name


SHIPPED_DRAFTER = shipped_drafter()
CACHE_DIR = Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem"))
SELF_DRAFTER = CACHE_DIR / "drafters" / "smollm2-135m-instruct-self"


MODEL_FREE_DRAFTERS = ("suffix",)   # drafters with no model: served by name (drafter_service.factory)


def resolve_drafter(spec: str | None) -> Path | str:
    """'default' (or empty) -> the default drafter's directory; 'suffix' -> itself (the model-free drafter,
    no files; a file or folder of that name in the working directory is not looked at); anything else is a
    path used as is."""
    if spec in MODEL_FREE_DRAFTERS:
        return spec
    if spec and spec != "default":
        path = Path(spec).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"drafter {spec!r} not found (give an .onnx file, a directory holding model.onnx, a .gguf file, "
                                "or 'suffix' for the model-free drafter)")
        return path
    if (SHIPPED_DRAFTER / "model.onnx").exists():
        return SHIPPED_DRAFTER
    if (SELF_DRAFTER / "model.onnx").exists():
        return SELF_DRAFTER
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise FileNotFoundError(
            "no default drafter here and torch is missing to make one: copy a drafter directory "
            "(model.onnx + drafter.json) to this machine and pass --drafter DIR, or run "
            "`tandem export-drafter --model default --out DIR` where torch is installed") from exc
    from tandem.export import export_drafter

    print(f"[tandem] first use: exporting the default target to ONNX as the drafter ({SELF_DRAFTER})",
          file=sys.stderr, flush=True)
    export_drafter("default", SELF_DRAFTER, check=True)
    return SELF_DRAFTER
