"""The exact-rows attention kernel (verifier_service/kernels/ops_*.c, the ISA native picks): each row attends to its own causal
prefix of the static cache, matches torch's softmax attention to fp32 rounding, and a row's output never
depends on how many rows the call has or on the thread count; the static decoder uses it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tandem.types import SamplingParams
from tests.tiny_models import make_tiny_model
from verifier_service import native
from verifier_service.kv_cache import TargetSession
from verifier_service.target import Target

pytestmark = pytest.mark.skipif(native.library() is None,
                                reason=f"C kernels unavailable: {native.unavailable_reason()}")


def attend(q, kv, start, heads, kv_heads, d, scale, threads=1):
    n = q.shape[0]
    out = torch.empty(n, heads * d)
    plane = kv.shape[1] * kv.shape[2] * kv.shape[3]
    native.library().row_attention(q.data_ptr(), q.stride(0), n, heads, kv_heads, d, kv.data_ptr(),
                                   kv.data_ptr() + plane * 4, kv.shape[2], start, scale, out.data_ptr(), threads)
    return out


@pytest.mark.parametrize("d, heads, kv_heads", [(16, 9, 3), (64, 9, 3), (256, 4, 1), (64, 8, 1), (128, 8, 2)])
def test_rows_match_torch_and_do_not_depend_on_width_or_threads(d, heads, kv_heads):
    gen = torch.Generator().manual_seed(0)
    cap, start, n = 300, 250, 12
    kv = torch.randn(2, kv_heads, cap, d, generator=gen)
    qk = torch.randn(n, heads + kv_heads, d, generator=gen)     # q is a strided slice, as in the decoder
    q = qk[:, :heads]
    scale = d ** -0.5
    full = attend(q, kv, start, heads, kv_heads, d, scale)
    for i in range(n):
        m = start + i + 1
        keys = kv[0, :, :m].repeat_interleave(heads // kv_heads, 0)     # [H, m, D]
        values = kv[1, :, :m].repeat_interleave(heads // kv_heads, 0)
        want = torch.softmax(q[i][:, None] @ keys.transpose(1, 2) * scale, -1) @ values   # [H, 1, D]
        torch.testing.assert_close(full[i], want.reshape(-1), rtol=1e-5, atol=1e-6)
    for width in (1, 2, 5, 12):
        for first in (0, n - width):
            part = attend(q[first:first + width], kv, start + first, heads, kv_heads, d, scale)
            assert torch.equal(part, full[first:first + width]), (width, first)
    # one thread takes the heads that share a KV head in one pass over its cache; with fewer KV heads than
    # threads (and d >= 128), the threads split each KV head's keys and then its columns: the same bits
    # every way
    for threads in (2, 3, 4):
        assert torch.equal(attend(q, kv, start, heads, kv_heads, d, scale, threads=threads), full), threads
        for first in (0, n - 1):
            one = attend(q[first:first + 1], kv, start + first, heads, kv_heads, d, scale, threads=threads)
            assert torch.equal(one, full[first:first + 1]), (threads, first)


def test_static_decoder_uses_it_and_stays_exact(tmp_path):
    """A tiny Llama with head_dim 16: the static decoder's rows come from the kernel, match transformers'
    forward, and a verify block's rows equal plain steps bit for bit."""
    path = make_tiny_model(tmp_path / "hd16", seed=4, hidden=64, layers=2, heads=4, kv_heads=2)
    target = Target.load(str(path), gemm="onednn", widths=(1, 3))
    eager = Target.load(str(path), gemm="mkl", warmup=False)
    assert "C kernel" in target.decoder.describe()
    seq = [3, 9, 4, 22, 17, 5, 30, 8, 11, 2, 40, 7]

    def logits(t, ids, split):
        session = TargetSession("s", t._new_cache(), 0, -1, SamplingParams(), torch.Generator())
        rows = []
        for a, b in zip([0, *split], [*split, len(ids)]):
            rows.append(t._forward(session, ids[a:b]))
        return torch.cat(rows)

    one_by_one = logits(target, seq, list(range(1, len(seq))))
    torch.testing.assert_close(one_by_one, logits(eager, seq, []), rtol=1e-4, atol=1e-4)
    blocks = logits(target, seq, [5, 8])           # a prefill of 5, then blocks of 3 and 4 rows
    assert torch.equal(blocks[5:], one_by_one[5:])
