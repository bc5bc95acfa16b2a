"""Integration fixtures: the real default pair, loaded once per test session."""

import pytest


@pytest.fixture(scope="session")
def default_target():
    from verifier_service.target import Target

    return Target.load("default")


@pytest.fixture(scope="session")
def default_drafter():
    from drafter_service.onnx_drafter import OnnxDrafter
    from tandem.defaults import resolve_drafter

    return OnnxDrafter(resolve_drafter("default"), threads=1)
