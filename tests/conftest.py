import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402

from harness import LoopThread  # noqa: E402
from tiny_models import make_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def lt():
    """An asyncio loop on its own thread, for in-process servers (harness.LoopThread)."""
    loop = LoopThread()
    yield loop
    loop.close()


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory) -> Path:
    """A tiny random Llama target (vocab 64) in a Hugging Face directory."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny_target"), seed=1)


@pytest.fixture(scope="session")
def tiny_drafter_dir(tmp_path_factory) -> Path:
    """A different tiny random Llama (same tokenizer) to act as the drafter."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny_drafter"), seed=2, hidden=16, layers=1, heads=2, kv_heads=1)


@pytest.fixture(scope="session")
def tiny_drafter_export(tiny_drafter_dir, tmp_path_factory):
    """(directory, ExportReport) of the tiny drafter exported to ONNX (model.onnx + drafter.json)."""
    from tandem.export import export_drafter

    out = tmp_path_factory.mktemp("tiny_drafter_onnx")
    return out, export_drafter(tiny_drafter_dir, out, check=True)


@pytest.fixture(scope="session")
def tiny_drafter_onnx(tiny_drafter_export) -> Path:
    """Directory holding model.onnx + drafter.json of the tiny drafter (what OnnxDrafter loads)."""
    return tiny_drafter_export[0]


@pytest.fixture(scope="session")
def tiny_long_target_dir(tmp_path_factory) -> Path:
    """The tiny target with room for 512 positions (256-token generations)."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny_long_target"), seed=1, max_positions=512)


@pytest.fixture(scope="session")
def tiny_long_drafter_onnx(tmp_path_factory) -> Path:
    """The tiny drafter with 512 positions, exported to ONNX (a directory OnnxDrafter and serve-drafter load)."""
    from tandem.export import export_drafter

    src = make_tiny_model(tmp_path_factory.mktemp("tiny_long_drafter"), seed=2, hidden=16, layers=1, heads=2,
                          kv_heads=1, max_positions=512)
    out = tmp_path_factory.mktemp("tiny_long_drafter_onnx")
    export_drafter(src, out, check=True)
    return out


@pytest.fixture(scope="module")
def tiny_verifier(lt, tiny_target_dir):
    """The tiny target behind a real verifier service on a loopback port: (target, address)."""
    from verifier_service.server import start_verifier
    from verifier_service.target import Target

    target = Target.load(str(tiny_target_dir))
    service = lt.run(start_verifier(target))
    yield target, f"127.0.0.1:{service.port}"
    lt.run(service.stop(0))


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Every test starts with torch on the session's thread count: a test (or code it runs in-process, such as
    the distill CLI's ``--threads``) that changes it must not slow every torch test after it."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is not None:
        if before is None:
            before = _SESSION_THREADS.setdefault("torch", torch.get_num_threads())
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


_SESSION_THREADS: dict[str, int] = {}
