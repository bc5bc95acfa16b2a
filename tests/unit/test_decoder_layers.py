"""The layer loop as one C call (verifier_service/native_layers.py, kernels/decoder_layers.c): for every
architecture the GGUF fast path runs, both arithmetics and every ISA path this CPU runs, the logits are the
Python loop's (``Decoder._layers``) bit for bit: prefill, verify blocks of 1-8 rows past the sliding window,
and several sessions' blocks in one forward."""

from __future__ import annotations

import pytest
import torch

from tiny_models import GGUF_ARCHS
from verifier_service import native
from verifier_service.gguf_model import GgufModel

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SEQ = [1, 5, 9, 14, 3, 22, 40, 7, 63, 11, 100, 200, 30, 31, 32, 33, 34, 35, 90, 91, 92, 93]


@pytest.fixture(autouse=True)
def kernels():
    if native.library() is None:
        pytest.skip(f"C kernels unavailable: {native.unavailable_reason()}")


def decoders(path):
    """Two decoders of one file: the layer loop in C, and the Python loop (native_layers off)."""
    model = GgufModel(path)
    fast = model.decoder(native_ops=True)
    assert fast.native_layers is not None, fast.native_layers_note
    slow = model.decoder(native_ops=True)
    slow.native_layers = None
    return fast, slow


def run(decoder, steps):
    """Logits of feeding ``steps`` (lists of ids) one after another into one cache."""
    cache = decoder.new_cache()
    return [decoder.forward(cache, ids) for ids in steps]


@pytest.mark.parametrize("activations", ["fp32", "int8"])
@pytest.mark.parametrize("isa", native.runnable_isas())
@pytest.mark.parametrize("arch", list(GGUF_ARCHS))
def test_the_c_layer_loop_gives_the_python_loops_bits(tiny_gguf_files, arch, isa, activations, monkeypatch):
    monkeypatch.setenv("TANDEM_ISA", isa)
    monkeypatch.setenv("TANDEM_ACTIVATIONS", activations)
    fast, slow = decoders(tiny_gguf_files[arch])
    assert fast.ops.isa == isa
    # a prefill, then blocks of every width up to 8 (positions past the tiny models' windows of 6 and 8)
    steps = [SEQ[:10]] + [SEQ[10 + w:10 + 2 * w] or [w] for w in range(1, 9)]
    for i, (a, b) in enumerate(zip(run(fast, steps), run(slow, steps))):
        assert torch.equal(a, b), (arch, isa, activations, i, (a - b).abs().max().item())


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_several_sessions_in_one_forward(tiny_gguf_files, arch):
    """forward_blocks: each session's rope, KV store and attention over its own cache, inside the C loop."""
    fast, slow = decoders(tiny_gguf_files[arch])
    got = []
    for decoder in (fast, slow):
        caches = [decoder.new_cache() for _ in range(3)]
        for cache, n in zip(caches, (12, 3, 7)):
            decoder.forward(cache, SEQ[:n])
        got.append(decoder.forward_blocks([(caches[0], [5, 6, 7]), (caches[1], [9]), (caches[2], SEQ[:5])]))
        assert [c.length for c in caches] == [15, 4, 12]
    for a, b in zip(*got):
        assert torch.equal(a, b)


@pytest.mark.parametrize("isa", native.runnable_isas())
def test_sessions_sharing_a_forward_split_among_threads_keep_their_bits(tiny_gguf_files, isa, monkeypatch):
    """The C loop's attention runs every session's (row, head) tasks in one parallel region, numbered one
    session after another: with 3 threads the shares cut across sessions (blocks of 1-5 rows, caches of
    different lengths, past the sliding windows), and each session's logits are still those it gets alone on
    one thread."""
    monkeypatch.setenv("TANDEM_ISA", isa)
    fast, _ = decoders(tiny_gguf_files["gemma3"])
    sessions = [(SEQ[:12], [5, 6, 7]), (SEQ[:3], [9]), (SEQ[:7], SEQ[:5]), (SEQ[:20], [4]), (SEQ[:9], [8, 2])]
    alone = []
    for prompt, block in sessions:
        cache = fast.new_cache()
        fast.forward(cache, prompt)
        alone.append(fast.forward(cache, block))
    caches = [fast.new_cache() for _ in sessions]
    for cache, (prompt, _) in zip(caches, sessions):
        fast.forward(cache, prompt)
    torch.set_num_threads(3)
    try:
        shared = fast.forward_blocks([(cache, block) for cache, (_, block) in zip(caches, sessions)])
    finally:
        torch.set_num_threads(1)
    for i, (a, b) in enumerate(zip(shared, alone)):
        assert torch.equal(a, b), (isa, i, (a - b).abs().max().item())


def test_the_python_loop_runs_where_the_c_loop_does_not(tiny_gguf_files, monkeypatch):
    """Blocks within the exact-rows bound never enter the Python loop; a prefill chunk wider than it does
    (masked attention over torch's GEMM); the torch op backend has no C loop and says so."""
    fast, _ = decoders(tiny_gguf_files["llama"])
    called = []
    python_loop = fast._layers
    monkeypatch.setattr(fast, "_layers", lambda *a: (called.append(1), python_loop(*a)))
    cache = fast.new_cache()
    fast.forward(cache, SEQ[:8])
    fast.forward(cache, [3, 4, 5])
    assert not called
    fast.forward(fast.new_cache(), [(7 * i + 3) % 260 for i in range(45)])
    assert called
    reference = GgufModel(tiny_gguf_files["llama"]).decoder(native_ops=False)
    assert reference.native_layers is None and "torch op backend" in reference.native_layers_note
