"""drafter_service.onnx_drafter (the model drafter + prompt lookup): proposals, KV rollback, sampling, sessions,
errors. The drafter kinds themselves: test_drafter_kinds.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from drafter_service.onnx_drafter import OnnxDrafter
from tandem.errors import UnknownSession
from tandem.types import SamplingParams

PROMPT = [1, 12, 40, 7, 33, 5, 60, 21]
SAMPLED = SamplingParams(temperature=1.0, top_p=0.95, seed=7)
UNSEEDED = SamplingParams(temperature=1.0, top_p=0.95)


@pytest.fixture
def drafter(tiny_drafter_onnx) -> OnnxDrafter:
    return OnnxDrafter(tiny_drafter_onnx, threads=1, providers=["CPUExecutionProvider"], support_size=16)


def torch_greedy(model_dir, context, n):
    torch = pytest.importorskip("torch")
    from tandem.models import load_causal_lm

    model, _, _ = load_causal_lm(model_dir)
    ids = list(context)
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(torch.argmax(logits)))
    return ids[len(context):]


def test_info(drafter, tiny_drafter_onnx):
    meta = json.loads((tiny_drafter_onnx / "drafter.json").read_text())
    info = drafter.info
    assert info.vocab_size == 64 and info.max_context == 256 and info.eos_token_ids == (2,)
    assert info.vocab_hash == meta["vocab_hash"] and info.vocab_hash.startswith("sha256:")


def test_greedy_equals_torch_greedy(drafter, tiny_drafter_dir):
    want = torch_greedy(tiny_drafter_dir, PROMPT, 6)
    p = drafter.propose("s", 0, PROMPT, 6, SamplingParams())
    assert p.token_ids == want
    assert all(t.support_ids == () and t.support_probs == () for t in p.tokens)
    assert p.compute_ms > 0
    # accept 2 drafts + a correction: the drafter continues from the new context like torch does
    context = PROMPT + want[:2] + [9]
    p2 = drafter.propose("s", len(PROMPT), want[:2] + [9], 4)
    assert p2.token_ids == torch_greedy(tiny_drafter_dir, context, 4)


def test_rollback_equals_fresh_session(drafter):
    drafter.propose("a", 0, PROMPT, 5)
    drafter.propose("a", len(PROMPT), [3, 4], 5)               # context PROMPT+[3,4], KV holds 4 drafts more
    got = drafter.propose("a", 5, [50, 51, 52], 5)              # shorter prefix, different tokens
    fresh = drafter.propose("b", 0, PROMPT[:5] + [50, 51, 52], 5)
    assert got.token_ids == fresh.token_ids
    # prefix_length 0 on a known session replaces its context
    again = drafter.propose("a", 0, PROMPT, 5)
    assert again.token_ids == drafter.propose("c", 0, PROMPT, 5).token_ids
    # empty append: the same context proposes the same greedy block
    assert drafter.propose("a", len(PROMPT), [], 5).token_ids == again.token_ids


def test_accepting_every_draft_reuses_the_cache(drafter):
    first = drafter.propose("s", 0, PROMPT, 4)
    # all 4 accepted + bonus token 11: the KV for PROMPT + 3 drafts is reused
    got = drafter.propose("s", len(PROMPT), first.token_ids + [11], 4)
    assert got.token_ids == drafter.propose("f", 0, PROMPT + first.token_ids + [11], 4).token_ids


def test_sampled_support_and_reproducibility(drafter):
    s = drafter.propose("s", 0, PROMPT, 5, UNSEEDED)       # rejection sampling reads q: each token carries it
    assert len(s.tokens) == 5
    for t in s.tokens:
        assert 1 <= len(t.support_ids) <= 16 and len(t.support_ids) == len(t.support_probs)
        assert t.token_id in t.support_ids
        assert abs(sum(t.support_probs) - 1.0) < 1e-5
        assert all(q > 0 for q in t.support_probs) and list(t.support_probs) == sorted(t.support_probs, reverse=True)
        assert all(0 <= i < 64 for i in t.support_ids)
        np.float32(t.support_probs[0])  # float32 values, as sent
    r = drafter.propose("z", 0, PROMPT, 5, SamplingParams(temperature=1.0, top_p=0.95))
    assert r.tokens[0].support_probs == s.tokens[0].support_probs  # q depends on the context only
    p = drafter.propose("x", 0, PROMPT, 5, SAMPLED)       # seeded (coupled): ids only, q never read
    assert len(p.tokens) == 5 and not any(t.support_ids or t.support_probs for t in p.tokens)
    q = drafter.propose("y", 0, PROMPT, 5, SAMPLED)
    assert q.tokens == p.tokens                       # same seed, same context: same block and same q
    later = [drafter.propose("x", len(PROMPT), [], 5, SAMPLED).token_ids for _ in range(4)]
    assert all(t == p.token_ids for t in later)        # seeded (coupled): a function of the seed and the positions
    unseeded = SamplingParams(temperature=1.0, top_p=0.95)
    later = [drafter.propose("u", 0, PROMPT, 5, unseeded).token_ids for _ in range(5)]
    assert len({tuple(t) for t in later}) > 1          # unseeded: the session's generator advances


def test_samples_follow_the_reported_distribution(drafter):
    sampling = SamplingParams(temperature=1.5, top_k=6)     # unseeded: drawn from the session's generator
    first = drafter.propose("d", 0, PROMPT, 1, sampling).tokens[0]
    q = dict(zip(first.support_ids, first.support_probs))
    n = 1500
    counts = {}
    for _ in range(n):
        t = drafter.propose("d", len(PROMPT), [], 1, sampling).tokens[0]
        assert t.support_ids == first.support_ids  # same context: same q (up to float rounding of the
        np.testing.assert_allclose(t.support_probs, first.support_probs, atol=1e-5)  # re-fed last token)
        counts[t.token_id] = counts.get(t.token_id, 0) + 1
    assert set(counts) <= set(q)
    tv = 0.5 * sum(abs(counts.get(i, 0) / n - p) for i, p in q.items())
    assert tv < 0.06


def test_draft_vocab_mapping(tiny_drafter_onnx, tmp_path):
    """A drafter with draft_vocab maps logit indices to target ids (here a permutation)."""
    for f in ("model.onnx", "drafter.json"):
        shutil.copy(tiny_drafter_onnx / f, tmp_path / f)
    perm = np.random.default_rng(0).permutation(64).astype(np.int64)
    np.save(tmp_path / "draft_vocab.npy", perm)
    meta = json.loads((tmp_path / "drafter.json").read_text())
    meta["draft_vocab"] = "draft_vocab.npy"
    (tmp_path / "drafter.json").write_text(json.dumps(meta))
    plain = OnnxDrafter(tiny_drafter_onnx, threads=1, providers=["CPUExecutionProvider"])
    mapped = OnnxDrafter(tmp_path, threads=1, providers=["CPUExecutionProvider"])
    assert mapped.propose("s", 0, PROMPT, 1).token_ids == [int(perm[plain.propose("s", 0, PROMPT, 1).token_ids[0]])]
    a = plain.propose("t", 0, PROMPT, 1, SAMPLED).tokens[0]
    b = mapped.propose("t", 0, PROMPT, 1, SAMPLED).tokens[0]
    assert list(b.support_ids) == [int(perm[i]) for i in a.support_ids] and b.support_probs == a.support_probs


def test_without_metadata_reads_shapes_from_the_graph(tiny_drafter_onnx, tmp_path, drafter):
    shutil.copy(tiny_drafter_onnx / "model.onnx", tmp_path / "model.onnx")
    bare = OnnxDrafter(tmp_path / "model.onnx", threads=1, providers=["CPUExecutionProvider"])
    assert bare.info.vocab_size == 64 and bare.info.vocab_hash == "" and bare.info.max_context == 0
    assert bare.propose("s", 0, PROMPT, 3).token_ids == drafter.propose("s", 0, PROMPT, 3).token_ids


def test_unknown_session(drafter):
    with pytest.raises(UnknownSession, match="drafter session 'nope'.*resend the whole context with prefix_length 0"):
        drafter.propose("nope", 3, [4], 2)
    drafter.propose("s", 0, PROMPT, 2)
    with pytest.raises(UnknownSession, match="knows 8 tokens, not 9: resend the whole context with prefix_length 0"):
        drafter.propose("s", len(PROMPT) + 1, [4], 2)  # longer than what it knows (drafts don't count)
    assert issubclass(UnknownSession, KeyError)
    assert drafter.end_session("s") is True and drafter.end_session("s") is False
    with pytest.raises(KeyError):
        drafter.propose("s", 2, [4], 2)


@pytest.mark.parametrize("kwargs,match", [
    (dict(appended_tokens=[1, 64], k=2), "vocabulary"),
    (dict(appended_tokens=[-1], k=2), "vocabulary"),
    (dict(appended_tokens=[1, 2], k=0), "k must be"),
    (dict(appended_tokens=[], k=2), "empty context"),
])
def test_bad_arguments(drafter, kwargs, match):
    with pytest.raises(ValueError, match=match):
        drafter.propose("s", 0, **kwargs)


def test_bad_sampling_params(drafter):
    with pytest.raises(ValueError):
        drafter.propose("s", 0, PROMPT, 2, SamplingParams(temperature=1.0, top_p=0.0))


def test_session_accounting_and_eviction(drafter):
    assert drafter.session_count() == 0 and drafter.kv_bytes() == 0
    drafter.propose("a", 0, PROMPT, 3)
    drafter.propose("b", 0, PROMPT[:4], 3)
    assert drafter.session_count() == 2
    # 1 layer x (key + value) x 1 KV head x head_dim 8 x float32, for context + k-1 drafts
    assert drafter.kv_bytes() == 2 * 8 * 4 * ((len(PROMPT) + 2) + (4 + 2))
    assert drafter.evict_idle() == []
    import time
    assert sorted(drafter.evict_idle(time.monotonic() + 10_000)) == ["a", "b"]
    assert drafter.session_count() == 0 and drafter.kv_bytes() == 0


def test_drafter_service_imports_no_torch(tiny_drafter_onnx):
    code = textwrap.dedent(f"""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "transformers"):
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, Block())
        import drafter_service, drafter_service.sampling, tandem.sessions
        from drafter_service.onnx_drafter import OnnxDrafter
        from tandem.types import SamplingParams
        from drafter_service.factory import load_drafter
        d = OnnxDrafter({str(tiny_drafter_onnx)!r}, threads=1, providers=["CPUExecutionProvider"])
        p = d.propose("s", 0, [1, 2, 3], 2, SamplingParams(temperature=1.0, seed=1))
        assert len(p.tokens) == 2
        d = load_drafter({str(tiny_drafter_onnx)!r}, threads=1, lookup_max_ngram=3, lookup_trust_ngram=4)
        assert len(d.propose("s", 0, [1, 2, 3, 2], 3, SamplingParams(temperature=1.0, seed=1)).tokens) == 3
        assert not any(m.split(".")[0] in ("torch", "transformers") for m in sys.modules)
        print("ok")
    """)
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]


def test_confidence_stop_ends_the_block_before_an_unsure_token(drafter, tiny_drafter_onnx):
    """min_confidence: the block is the full greedy block cut before the first token (after the first)
    whose top probability is below the threshold; the session then continues exactly as a fresh one."""
    from drafter_service.sampling import softmax
    from tandem.distill.evaluate import OrtDrafter

    full = drafter.propose("full", 0, PROMPT, 6).token_ids
    ref = OrtDrafter(Path(tiny_drafter_onnx) / "model.onnx")
    logits, tops = ref.feed(PROMPT), []
    for tok in full:
        tops.append(float(softmax(logits.astype(np.float64)).max()))
        logits = ref.feed([tok])

    def expected(threshold):
        return next((i for i in range(1, 6) if tops[i] < threshold), 6)

    # thresholds half-way between the confidences seen (no float ties), below all and above all
    levels = sorted(set(tops[1:]))
    thresholds = [levels[0] / 2] + [(a + b) / 2 for a, b in zip(levels, levels[1:])] + [(levels[-1] + 1) / 2]
    for threshold in thresholds:
        got = drafter.propose(f"t{threshold}", 0, PROMPT, 6, SamplingParams(), min_confidence=threshold).token_ids
        assert got == full[:expected(threshold)], threshold
    assert expected(thresholds[0]) == 6 and expected(thresholds[-1]) == 1

    short = drafter.propose("s", 0, PROMPT, 6, SamplingParams(), min_confidence=1.0).token_ids
    assert short == full[:1]
    nxt = drafter.propose("s", len(PROMPT), short + [17], 3).token_ids
    assert nxt == drafter.propose("fresh", 0, PROMPT + short + [17], 3).token_ids
    sampled = drafter.propose("x", 0, PROMPT, 5, UNSEEDED, min_confidence=1.0)
    assert len(sampled.tokens) == 1 and sampled.tokens[0].support_ids
    with pytest.raises(ValueError, match="min_confidence"):
        drafter.propose("s", 0, PROMPT, 2, SamplingParams(), min_confidence=1.5)


def _contexts_with_recurring_tokens(n, seed=3):
    """Random contexts over 10 token ids: their last token recurs, so prompt lookup always finds something
    (mostly 1- and 2-gram matches, the kind the drafter checks)."""
    rng = np.random.default_rng(seed)
    return [[1] + rng.integers(3, 13, size=int(rng.integers(6, 14))).tolist() for _ in range(n)]


def test_checked_lookup_keeps_only_what_the_model_allows(tiny_drafter_onnx):
    """Short lookup matches are checked against the model: at confidence 0 every disagreement drops the
    rest of the lookup, so the greedy block is exactly the model's own; at confidence 1 nothing is ever
    dropped (the unchecked lookup); a long enough match is trusted and never checked. Sessions that
    dropped lookup tokens continue exactly like fresh ones (the KV was rolled back)."""
    def make(**kw):
        return OnnxDrafter(tiny_drafter_onnx, threads=1, lookup_max_ngram=3, lookup_min_ngram=1, **kw)

    plain = OnnxDrafter(tiny_drafter_onnx, threads=1)                    # the model alone
    unchecked = make()                                                    # lookup trusted at any length
    strict = make(lookup_trust_ngram=4, lookup_check_confidence=0.0)     # every disagreement drops
    lenient = make(lookup_trust_ngram=4, lookup_check_confidence=1.0)    # never confident enough to drop
    trusting = make(lookup_trust_ngram=1, lookup_check_confidence=0.0)   # nothing is short enough to check
    differ = 0
    for i, ctx in enumerate(_contexts_with_recurring_tokens(40)):
        model = plain.propose(f"p{i}", 0, ctx, 4).token_ids
        looked = unchecked.propose(f"u{i}", 0, ctx, 4).token_ids
        differ += looked != model
        assert strict.propose(f"s{i}", 0, ctx, 4).token_ids == model
        assert lenient.propose(f"l{i}", 0, ctx, 4).token_ids == looked
        assert trusting.propose(f"t{i}", 0, ctx, 4).token_ids == looked
        # the strict session continues from its rolled-back cache exactly like a fresh one
        nxt = strict.propose(f"s{i}", len(ctx), [model[0], 7], 3).token_ids
        assert nxt == plain.propose(f"f{i}", 0, ctx + [model[0], 7], 3).token_ids
    assert differ >= 10, "the contexts must make lookup and model disagree, or the test checks nothing"


def test_checked_lookup_reports_the_model_distribution_where_it_drops(tiny_drafter_onnx):
    """Sampled drafts: kept lookup tokens are point masses; where the check drops the lookup, the model's
    token comes with q given the context and the kept tokens (what a fresh model-only session reports)."""
    plain = OnnxDrafter(tiny_drafter_onnx, threads=1, support_size=16)
    strict = OnnxDrafter(tiny_drafter_onnx, threads=1, support_size=16, lookup_max_ngram=3, lookup_min_ngram=1,
                         lookup_trust_ngram=4, lookup_check_confidence=0.0)
    checked_rows = 0
    for i, ctx in enumerate(_contexts_with_recurring_tokens(30, seed=5)):
        got = strict.propose(f"s{i}", 0, ctx, 3, SAMPLED).tokens
        kept = [t.token_id for t in got if t.support_ids == (t.token_id,)]
        assert all(t.support_probs == (1.0,) for t in got[:len(kept)])
        if len(kept) < len(got):
            first_model = got[len(kept)]
            ref = plain.propose(f"p{i}", 0, ctx + kept, 1, SAMPLED).tokens[0]
            assert first_model.support_ids == ref.support_ids
            np.testing.assert_allclose(first_model.support_probs, ref.support_probs, rtol=1e-5)
            checked_rows += 1
    assert checked_rows >= 10


# ------------------------------------------------------------------ the shared-buffer graph (tandem.export_shared_kv)

@pytest.fixture(scope="module")
def kv_layouts(tmp_path_factory):
    """(HF directory, classic graph, shared-buffer graph) of one tiny drafter (head_dim 16, as
    GroupQueryAttention needs; 600 positions)."""
    from tandem.export import export_drafter
    from tiny_models import make_tiny_model

    src = make_tiny_model(tmp_path_factory.mktemp("hd16"), seed=4, hidden=32, layers=2, heads=2, kv_heads=1,
                          max_positions=600)
    classic, shared = tmp_path_factory.mktemp("hd16_classic"), tmp_path_factory.mktemp("hd16_shared")
    export_drafter(src, classic, check=True)
    export_drafter(src, shared, check=True, kv_cache="shared")
    return src, classic, shared


def _round_trip(drafter, rng_seed: int, sessions: int = 6, rounds: int = 10):
    """Rounds as the gateway drives them (random acceptance, bonus tokens, an occasional rollback or fresh
    context, greedy and sampled blocks); every proposal's tokens and q."""
    rng = np.random.default_rng(rng_seed)
    out = []
    for s in range(sessions):
        context = rng.integers(3, 64, size=int(rng.integers(4, 300))).tolist()
        appended, known = context, 0
        for r in range(rounds):
            sampling = SAMPLED if r % 3 == 2 else SamplingParams()
            p = drafter.propose(f"s{s}", known, appended, int(rng.integers(1, 7)), sampling)
            out.append([(t.token_id, t.support_ids, t.support_probs) for t in p.tokens])
            accepted = int(rng.integers(0, len(p.tokens) + 1))
            known = len(context)
            if r % 4 == 3:                          # the gateway resends from an earlier prefix
                known = int(rng.integers(1, len(context)))
                context = context[:known]
            bonus, caught_up = int(rng.integers(3, 64)), rng.integers(3, 64, size=int(rng.integers(0, 40))).tolist()
            appended = p.token_ids[:accepted] + [bonus] + caught_up
            context = context + appended
    return out


@pytest.mark.parametrize("lookup", [{}, dict(lookup_max_ngram=3, lookup_min_ngram=1, lookup_trust_ngram=4,
                                             lookup_check_confidence=0.0)])
def test_shared_kv_graph_proposes_what_the_classic_graph_proposes(kv_layouts, lookup):
    """The same rounds on both graphs of one model: the same greedy and sampled tokens, q equal to float
    rounding; contexts past 256 tokens grow the buffers, prefill in runs of 64 tokens, checked lookup rolls back."""
    classic, shared = (OnnxDrafter(d, threads=1, support_size=16, prefill_chunk=64, **lookup) for d in kv_layouts[1:])
    assert shared.inner._shared is not None and classic.inner._shared is None
    a, b = _round_trip(classic, 11), _round_trip(shared, 11)
    assert len(a) == len(b) == 60
    for block_a, block_b in zip(a, b):
        assert [t[0] for t in block_a] == [t[0] for t in block_b]
        for (_, ids_a, q_a), (_, ids_b, q_b) in zip(block_a, block_b):
            assert ids_a == ids_b
            np.testing.assert_allclose(q_a, q_b, atol=1e-5)


def test_shared_kv_graph_equals_torch_greedy_and_rolls_back(kv_layouts):
    src, _, shared = kv_layouts
    drafter = OnnxDrafter(shared, threads=1)
    p = drafter.propose("s", 0, PROMPT, 6)
    assert p.token_ids == torch_greedy(src, PROMPT, 6)
    context = PROMPT + p.token_ids[:2] + [9]              # 2 drafts accepted + a correction
    assert drafter.propose("s", len(PROMPT), p.token_ids[:2] + [9], 4).token_ids == torch_greedy(src, context, 4)
    # back to the first 5 tokens and a different continuation: as a fresh session
    fresh = drafter.propose("f", 0, PROMPT[:5] + [50, 51, 52], 5).token_ids
    assert drafter.propose("s", 5, [50, 51, 52], 5).token_ids == fresh


def test_shared_kv_buffers_grow_and_are_counted(kv_layouts):
    """kv_bytes counts the buffers' capacity: rows in steps of 256, doubling; a rollback keeps them, an
    evicted session frees them."""
    from drafter_service.kv_buffers import CAPACITY_STEP

    drafter = OnnxDrafter(kv_layouts[2], threads=1)
    row_bytes = 2 * 2 * 1 * 16 * 4                  # layers x (key + value) x KV heads x head_dim x float32
    drafter.propose("a", 0, PROMPT, 3)
    assert drafter.kv_bytes() == CAPACITY_STEP * row_bytes
    long_context = PROMPT + list(range(3, 63)) * 5  # 308 tokens
    drafter.propose("a", len(PROMPT), long_context[len(PROMPT):], 3)
    assert drafter.kv_bytes() == 2 * CAPACITY_STEP * row_bytes
    assert drafter.propose("a", 4, [7], 2).token_ids == drafter.propose("b", 0, PROMPT[:4] + [7], 2).token_ids
    assert drafter.kv_bytes() == (2 * CAPACITY_STEP + CAPACITY_STEP) * row_bytes
    import time
    drafter.evict_idle(time.monotonic() + 10_000)
    assert drafter.kv_bytes() == 0
