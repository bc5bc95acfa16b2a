"""Fixtures for the unit tests: tiny models exported to ONNX once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_target_export(tiny_target_dir, tmp_path_factory):
    """(directory, ExportReport) of the tiny target (2 layers, 4 heads / 2 KV heads) exported to ONNX."""
    from tandem.export import export_drafter

    out = tmp_path_factory.mktemp("tiny_target_onnx")
    return out, export_drafter(tiny_target_dir, out, check=True)


@pytest.fixture(scope="session")
def tiny_drafter_export(tiny_drafter_dir, tmp_path_factory):
    """(directory, ExportReport) of the tiny drafter (1 layer, 2 heads / 1 KV head) exported to ONNX."""
    from tandem.export import export_drafter

    out = tmp_path_factory.mktemp("tiny_drafter_onnx")
    return out, export_drafter(tiny_drafter_dir, out, check=True)


@pytest.fixture(scope="session")
def tiny_drafter_onnx(tiny_drafter_export) -> Path:
    """Directory holding model.onnx + drafter.json of the tiny drafter (what OnnxDrafter loads)."""
    return tiny_drafter_export[0]
