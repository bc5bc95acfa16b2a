"""Fixtures for the unit tests (the tiny drafter's export lives in tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch

from tiny_models import GGUF_ARCHS, GGUF_MIX


@pytest.fixture(scope="session")
def tiny_gguf_files(tmp_path_factory) -> dict:
    """{architecture: path} of tiny random GGUF files in the GGUF_MIX of block types."""
    from tandem.bench.random_gguf import write

    folder = tmp_path_factory.mktemp("gguf")
    return {name: write(folder / f"{name}.gguf", arch="llama" if name == "mistral-window" else name, std=0.3,
                        kinds=GGUF_MIX, seed=1, **extra) for name, extra in GGUF_ARCHS.items()}


@pytest.fixture(scope="module")
def one_torch_thread():
    """Torch on one thread for a module: tiny models run fastest so, and the test ignores other load."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_target_export(tiny_target_dir, tmp_path_factory):
    """(directory, ExportReport) of the tiny target (2 layers, 4 heads / 2 KV heads) exported to ONNX."""
    from tandem.export import export_drafter

    out = tmp_path_factory.mktemp("tiny_target_onnx")
    return out, export_drafter(tiny_target_dir, out, check=True)
