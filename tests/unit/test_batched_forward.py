"""Verify blocks of several sessions in one forward (``Decoder.forward_blocks``, the scheduler's verify batches):
each session's logits are bit-identical to its forward alone, whoever shares the forward, on both op backends
and every architecture of the fast path; through ``Target``, concurrent sessions really share forwards and
decode exactly what each decodes alone."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from tandem.types import DraftToken, SamplingParams
from tiny_models import make_tokenizer
from verifier_service import native, torch_thread
from verifier_service.gguf_model import GgufModel
from verifier_service.target import Target

ARCHS = ["llama", "qwen3", "gemma3", "mistral-window"]
BACKENDS = ["native", "torch"]


@pytest.fixture(autouse=True, scope="module")
def two_threads():
    """Two threads: the kernels split rows and heads between them, as the verifier runs them."""
    before = torch.get_num_threads()
    torch_thread.run(torch.set_num_threads, 2)
    yield
    torch_thread.run(torch.set_num_threads, before)


def sessions_of(vocab: int, n: int = 8, seed: int = 0):
    """n sessions: (prompt, block) of different lengths (prompts past the sliding windows, blocks of 1..6 rows)."""
    rng = random.Random(seed)
    return [([rng.randrange(3, vocab) for _ in range(3 + 5 * i)], [rng.randrange(3, vocab) for _ in range(1 + i % 6)])
            for i in range(n)]


def alone_and_batched(decoder, sessions):
    """Each session's block logits run alone, and run batched with the sessions before it (1..n at once)."""
    def run():
        alone = []
        for prompt, block in sessions:
            cache = decoder.new_cache()
            decoder.forward(cache, prompt, last_only=True)
            alone.append(decoder.forward(cache, block))
        batched = {}
        for m in range(2, len(sessions) + 1):
            caches = []
            for prompt, _ in sessions[:m]:
                cache = decoder.new_cache()
                decoder.forward(cache, prompt, last_only=True)
                caches.append(cache)
            batched[m] = decoder.forward_blocks([(c, block) for c, (_, block) in zip(caches, sessions[:m])])
            assert [c.length for c in caches] == [len(p) + len(b) for p, b in sessions[:m]]
        return alone, batched
    return torch_thread.run(run)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", list(ARCHS))
def test_a_sessions_logits_do_not_depend_on_who_shares_the_forward(tiny_gguf_files, arch, backend):
    """The same session's logits alone and batched with 1..7 other sessions of other widths and cache lengths:
    bit for bit equal, every row of every session (the sliding windows included)."""
    if backend == "native" and native.library() is None:
        pytest.skip(f"C kernels unavailable: {native.unavailable_reason()}")
    decoder = GgufModel(tiny_gguf_files[arch]).decoder(native_ops=backend == "native")
    sessions = sessions_of(decoder.spec.vocab)
    assert sum(len(b) for _, b in sessions) <= decoder.max_exact_rows
    alone, batched = alone_and_batched(decoder, sessions)
    for m, out in batched.items():
        for i in range(m):
            assert torch.equal(out[i], alone[i]), (arch, backend, m, i, (out[i] - alone[i]).abs().max().item())


def test_the_dense_path_batches_where_its_gemm_rows_are_exact(tiny_target_dir):
    """A Hugging Face model's fp32 weights on oneDNN's packed GEMM (rows independent of the row count here): the
    same equality. MKL, whose rows may depend on the row count, is probed and then not batched."""
    from verifier_service import fast_linear

    if not fast_linear.onednn_available():
        pytest.skip("oneDNN linears unavailable in this torch build")
    target = Target.load(str(tiny_target_dir), widths=(1, 2), warmup=False, gemm="onednn")
    assert target.batching_note == "" and target.scheduler.max_batch_sessions > 1
    alone, batched = alone_and_batched(target.decoder, sessions_of(target.vocab_size))
    for m, out in batched.items():
        for i in range(m):
            assert torch.equal(out[i], alone[i]), (m, i)
    mkl = Target.load(str(tiny_target_dir), widths=(1, 2), warmup=False, gemm="mkl", decoder="static")
    assert mkl.scheduler.max_batch_sessions == 1 if mkl.batching_note else mkl.scheduler.max_batch_sessions > 1
    assert "batched" in mkl.startup_line() or "one session a forward" in mkl.startup_line()


def test_one_block_per_cache(tiny_gguf_files):
    target = tiny_target(tiny_gguf_files["llama"])
    cache = target.decoder.new_cache()
    with pytest.raises(ValueError, match="one block per cache"):
        torch_thread.run(target.decoder.forward_blocks, [(cache, [3]), (cache, [4])])


def tiny_target(path, **kw):
    return Target(GgufModel(path), make_tokenizer(260), path.stem, widths=(1, 2), warmup=False, **kw)


@pytest.fixture(scope="module")
def target(tiny_gguf_files):
    return tiny_target(tiny_gguf_files["llama"])


def decode(target, prompts, steps, drafts, rows=None):
    """Greedy decoding of every prompt at once (asyncio, one task each): ``steps`` rounds, each sending the
    block ``drafts(i, step)``; returns the tokens of each, and the forwards' (kind, sessions) the scheduler ran;
    ``rows`` (if given) collects each block's (own rows, forward_rows reported)."""
    forwards = []
    listener = lambda f: forwards.append((f.kind, f.sessions))      # noqa: E731 - kept alive below
    target.scheduler.add_listener(listener)

    async def one(i, prompt):
        sid = f"s{i}-{id(forwards)}"
        first, _ = await target.astart(sid, prompt, SamplingParams())
        tokens = [first]
        for step in range(steps):
            draft = drafts(i, step)
            out = await target.averify(sid, [DraftToken(t) for t in draft])
            tokens += draft[:out.accepted] + [out.next_token]
            if rows is not None:
                rows.append((len(draft) + 1, out.forward_rows))
        assert target.end(sid)
        return tokens

    async def all_of():
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    tokens = asyncio.run(all_of())
    del listener
    return tokens, forwards


def test_concurrent_sessions_share_forwards_and_decode_as_alone(target):
    """8 sessions decoding at once (plain steps and blocks of 2 and 3 drafts) share forwards; each one's tokens
    are those it decodes alone."""
    prompts = [p for p, _ in sessions_of(target.vocab_size)]
    drafts = lambda i, step: [(7 * i + 3 * step + j) % 90 + 3 for j in range(i % 4)]    # noqa: E731
    lone_rows, shared_rows = [], []
    alone = [decode(target, [p], 12, lambda _, step, i=i: drafts(i, step), lone_rows)[0][0]
             for i, p in enumerate(prompts)]
    together, forwards = decode(target, prompts, 12, drafts, shared_rows)
    assert together == alone
    shared = [n for kind, n in forwards if kind == "verify" and n > 1]
    assert shared and max(shared) >= 4, forwards
    # each reply says how many rows its forward had: its own alone, others' too when shared
    assert all(own == reported for own, reported in lone_rows)
    assert all(reported >= own for own, reported in shared_rows)
    assert max(reported - own for own, reported in shared_rows) >= 3


def test_a_batch_stays_within_its_rows(tiny_gguf_files):
    """``max_batch_rows`` bounds a forward's rows (a block wider than it goes alone: 6 drafts and the pending
    row, or the 6 drafts alone where the pending row was computed ahead)."""
    target = tiny_target(tiny_gguf_files["llama"], max_batch_rows=5)
    forwards = []
    listener = lambda f: forwards.append((f.rows, f.sessions)) if f.kind == "verify" else None    # noqa: E731
    target.scheduler.add_listener(listener)
    prompts = [p for p, _ in sessions_of(target.vocab_size)]
    tokens, _ = decode(target, prompts, 6, lambda i, step: [3 + i] * (2 if i else 6))
    assert len(tokens) == 8 and max(r for r, _ in forwards) in (6, 7)
    assert all(r <= 5 or n == 1 for r, n in forwards), forwards
