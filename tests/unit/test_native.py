"""Building the verifier's C kernels (verifier_service.native): a failed build or a missing compiler is a
reason, never a crash, and the static decoder then runs its torch ops with the same results."""

from __future__ import annotations

import pytest
import torch

from tests.tiny_models import make_tiny_model
from verifier_service import native
from verifier_service.static_decoder import StaticDecoder


def test_a_failed_build_is_a_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "/bin/false")                     # a "compiler" that always fails
    lib, why = native._build.__wrapped__()
    if "lacks" in why or "Linux x86-64" in why:
        pytest.skip(why)
    assert lib is None and "building the C kernels failed" in why
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    lib, why = native._build.__wrapped__()
    assert lib is None and "failed" in why


@pytest.mark.skipif(native.library() is None, reason=f"C kernels unavailable: {native.unavailable_reason()}")
def test_torch_ops_and_c_ops_agree(tmp_path):
    from transformers import AutoModelForCausalLM

    path = make_tiny_model(tmp_path / "hd16", seed=6, hidden=64, layers=2, heads=4, kv_heads=2)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with_c = StaticDecoder(model, gemm="mkl")
    with_torch = StaticDecoder(model, gemm="mkl", native_ops=False)
    assert "C kernel" in with_c.describe() and "C kernel" not in with_torch.describe()
    seq = [3, 9, 4, 22, 17, 5, 30, 8, 11, 2]
    outs = []
    for d in (with_c, with_torch):
        cache = d.new_cache()
        rows = [d.forward(cache, seq[:4])] + [d.forward(cache, [t]) for t in seq[4:]]
        outs.append(torch.cat(rows))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)
    assert outs[0].argmax(-1).tolist() == outs[1].argmax(-1).tolist()


def test_stale_kernel_builds_are_pruned_from_the_cache(tmp_path):
    """Each upgrade builds a new kernel library: builds of other sources unused for two weeks go, the one in
    use and recently used ones (another install sharing the cache) stay, and so do other files."""
    import os
    import time

    now = time.time()
    keep, stale, recent = (tmp_path / f"tandem_kernels-{n}.so" for n in ("a" * 16, "b" * 16, "c" * 16))
    other = tmp_path / "gemma.gguf"
    for path, age_days in ((keep, 30), (stale, 15), (recent, 1), (other, 400)):
        path.write_bytes(b"x")
        os.utime(path, (now - age_days * 86400, now - age_days * 86400))
    removed = native.prune_stale_builds(keep)
    assert removed == [stale]
    assert keep.exists() and recent.exists() and other.exists() and not stale.exists()
