"""Fixtures for the unit tests (the tiny drafter's export lives in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_target_export(tiny_target_dir, tmp_path_factory):
    """(directory, ExportReport) of the tiny target (2 layers, 4 heads / 2 KV heads) exported to ONNX."""
    from tandem.export import export_drafter

    out = tmp_path_factory.mktemp("tiny_target_onnx")
    return out, export_drafter(tiny_target_dir, out, check=True)
