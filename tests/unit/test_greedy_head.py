"""The greedy head (verifier_service/greedy_head.py, kernels/head_bound.h): each row's argmax from a bound pass and
the exact logits of the few rows that can win, without every exact logit. What greedy decoding relies on: the
argmax (and the first index among ties) is the full head's, bit for bit, on every ISA this CPU runs; the
logits it does compute are the full head's values; it steps aside where it cannot vouch for a row."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tandem.bench.random_gguf import write
from tandem.types import DraftToken, SamplingParams
from verifier_service import native

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.skipif(native.library() is None, reason="C kernels unavailable")]

VOCAB, HIDDEN = 4096, 256


class _Head:
    """A head as the decoder holds one (``weights.BlockWeight``: ``.blocks``)."""

    def __init__(self, raw, out, inner, isa, scaled=True, kind="Q8_0"):
        from verifier_service.quant import QuantWeight

        self.blocks = QuantWeight(kind, raw, out, inner, isa=isa, scaled=scaled)


def q8_rows(out, inner, seed=0, std=0.05):
    import gguf

    w = (np.random.default_rng(seed).standard_normal((out, inner)) * std).astype(np.float32)
    return gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0).reshape(out, -1)


def head_of(kind, isa=None, scaled=True, seed=0):
    """A random head of ``kind``: Q8_0 from gguf-py's quantizer, Q6_K random blocks (random_gguf)."""
    if kind == "Q8_0":
        return _Head(q8_rows(VOCAB, HIDDEN, seed), VOCAB, HIDDEN, isa, scaled)
    from tandem.bench.random_gguf import random_tensor

    raw = random_tensor(kind, VOCAB, HIDDEN, 0.05, np.random.default_rng(seed))
    return _Head(raw, VOCAB, HIDDEN, isa, scaled, kind)


def hidden_rows(n, seed, outliers=False):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, HIDDEN, generator=g)
    if outliers:                              # a few large dimensions, as final-normed states often have
        h[:, :3] *= 200.0
        h[:, 100:] *= 1e-3
    return h


@pytest.mark.parametrize("kind,scaled", [("Q8_0", True), ("Q8_0", False), ("Q6_K", False)])
@pytest.mark.parametrize("isa", [i for i in ("avx2", "generic", "avx512") if i in native.runnable_isas()])
def test_argmax_and_candidates_are_the_full_heads(isa, kind, scaled):
    """For rows of h at widths 1-8 (plain, large-range, and pointing at a row), each row's argmax is the full
    head's, and every logit it computed is the full head's value bit for bit (Q8_0 from the file's blocks or
    their fp32-scale copy; Q6_K, the output of most Q4_K_M files)."""
    from verifier_service.greedy_head import GreedyHead

    head = head_of(kind, isa, scaled)
    greedy = GreedyHead(head)
    rows = head.blocks.rows(np.arange(0, VOCAB, 97))                   # h = a head row: its own logit stands out
    cases = [hidden_rows(8, 1), hidden_rows(8, 2, outliers=True), rows[:8] * 3.0, rows[8:16]]
    for h in cases:
        for width in range(1, 9):
            x = h[:width].contiguous()
            full = head.blocks.matmul(x)
            out = torch.empty(width, VOCAB)
            assert greedy.logits_into(x, out)
            for r in range(width):
                kept = torch.isfinite(out[r])
                assert 0 < int(kept.sum()) < VOCAB // 4
                assert torch.equal(out[r][kept], full[r][kept])
                assert int(out[r].argmax()) == int(full[r].argmax())


def test_ties_keep_the_first_index():
    """Two identical head rows tie for the largest logit: both are candidates with equal values, and the argmax
    is the first of them, as over the full row."""
    from verifier_service.greedy_head import GreedyHead

    raw = q8_rows(VOCAB, HIDDEN, seed=4)
    raw[3001] = raw[77]
    head = _Head(raw, VOCAB, HIDDEN, None)
    h = head.blocks.rows([77]) * 2.0
    full = head.blocks.matmul(h)
    assert full[0, 77] == full[0, 3001] == full[0].max()
    out = torch.empty(1, VOCAB)
    assert GreedyHead(head).logits_into(h, out)
    assert out[0, 77] == out[0, 3001] and int(out[0].argmax()) == 77 == int(full[0].argmax())


def test_it_steps_aside_where_it_cannot_vouch():
    """A row of h that is not finite, or more rows than the kernel takes: False, the caller's buffer untouched
    (the decoder then computes the full head)."""
    from verifier_service.greedy_head import MAX_ROWS, GreedyHead

    head = _Head(q8_rows(VOCAB, HIDDEN), VOCAB, HIDDEN, None)
    greedy = GreedyHead(head)
    h = hidden_rows(2, 5)
    h[1, 7] = float("nan")
    out = torch.zeros(2, VOCAB)
    assert not greedy.logits_into(h, out) and not out.any()
    assert not greedy.logits_into(hidden_rows(MAX_ROWS + 1, 6), torch.zeros(MAX_ROWS + 1, VOCAB))


def test_other_heads_are_not_taken(tmp_path):
    """Only a Q8_0 or Q6_K head with fp32 activations: a Q4_0 head keeps the full head."""
    from verifier_service.gguf_model import GgufModel
    from verifier_service.greedy_head import applies

    q4 = GgufModel(write(tmp_path / "q4.gguf", kinds={"default": "Q4_0"}, seed=1)).decoder()
    assert not applies(q4.weights.head) and q4.greedy_head is None and q4.greedy_note.startswith("off")


@pytest.fixture(scope="module")
def tiny_q8(tmp_path_factory):
    return write(tmp_path_factory.mktemp("greedy") / "q8.gguf", vocab=2048, hidden=128, std=0.3, seed=7)


def test_decoder_rows_give_the_same_tokens(tiny_q8):
    """Through the decoder, argmax-only rows at every width give the tokens the full rows give, and the plain
    chain's tokens step by step; rows still exact across widths where they are computed."""
    from verifier_service.gguf_model import GgufModel

    decoder = GgufModel(tiny_q8).decoder()
    assert decoder.greedy_head is not None
    decoder.greedy_widths = frozenset(range(1, 9))          # as measure_greedy_head may choose on a CPU
    seq = [(13 * i + 5) % 2048 for i in range(40)]
    for width in range(1, 9):
        a, b = decoder.new_cache(), decoder.new_cache()
        decoder.forward(a, seq[:20])
        decoder.forward(b, seq[:20])
        fast = decoder.forward(a, seq[20:20 + width], argmax_only=True)
        full = decoder.forward(b, seq[20:20 + width])
        assert torch.equal(fast.argmax(-1), full.argmax(-1))
        kept = torch.isfinite(fast)
        assert torch.equal(fast[kept], full[kept])


def test_speculative_greedy_through_target_equals_plain(tiny_q8):
    """Greedy sessions through Target take argmax-only rows; speculative greedy is still the plain chain, and
    the plain chain is the one full rows give."""
    from plain_decoding import greedy_plain
    from tiny_models import make_tokenizer
    from verifier_service.gguf_model import GgufModel
    from verifier_service.target import Target

    def target(on):
        t = Target(GgufModel(tiny_q8), make_tokenizer(2048), "q8", widths=(1, 2, 4), warmup=False)
        t.decoder.greedy_widths = frozenset(range(1, 9)) if on else frozenset()
        return t

    prompt = [5, 9, 200, 31, 7, 1500, 64]
    reference = greedy_plain(target(False), prompt, 20, "full")
    fast = target(True)
    assert greedy_plain(fast, prompt, 20, "plain") == reference
    first, _ = fast.start("s", prompt, SamplingParams())
    out = [first]
    while len(out) < 20:
        truth = reference[len(out):len(out) + 4]
        guess = truth[:-1] + [(truth[-1] + 1) % 2048] if len(truth) == 4 else truth
        outcome = fast.verify("s", [DraftToken(t) for t in guess])
        out += guess[:outcome.accepted] + [outcome.next_token]
    assert out[:20] == reference
    assert fast.decoder.greedy_head.rows > 0


def test_sampled_sessions_keep_the_whole_head(tiny_q8):
    """A sampled (or seeded) session reads the distribution: its rows never take the bound pass, even with the
    greedy head on at every width; a greedy session's do."""
    from tiny_models import make_tokenizer
    from verifier_service.gguf_model import GgufModel
    from verifier_service.target import Target

    target = Target(GgufModel(tiny_q8), make_tokenizer(2048), "q8", widths=(1, 2, 4), warmup=False, greedy_head="on")
    greedy = target.decoder.greedy_head
    prompt = [5, 9, 200, 31, 7, 1500, 64]
    for sampling in (SamplingParams(temperature=0.8, seed=3), SamplingParams(temperature=0.8)):
        target.start("s", prompt, sampling)
        for _ in range(4):          # a copied token: q a point mass
            target.verify("s", [DraftToken(11, support_ids=(11,), support_probs=(1.0,), from_lookup=True)])
        target.end("s")
    assert greedy.rows == 0
    target.start("g", prompt, SamplingParams())
    target.verify("g", [DraftToken(11)])
    assert greedy.rows > 0
