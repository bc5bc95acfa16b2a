"""The verifier's fast forward paths (verifier_service.static_decoder, and transformers' forward with
fast_linear + forward for other models): the same math as transformers' eager forward, rows bit-identical
across block widths, rollback, the static cache growing, the GEMM choice, warm-up, chunked prefill."""

import threading
import time

import pytest
import torch

from plain_decoding import greedy_plain
from tandem.types import DraftToken, SamplingParams
from verifier_service import fast_linear, kv_cache, static_decoder
from verifier_service.kv_cache import TargetSession
from verifier_service.target import PrefillCancelled, Target

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def fast(tiny_target_dir):
    # "onednn" forced: on a 32-wide tiny model the measurement ("auto") may well pick MKL
    return Target.load(str(tiny_target_dir), gemm="onednn", widths=(1, 2, 3, 5))


@pytest.fixture(scope="module")
def hf_fast(tiny_target_dir):
    """transformers' own forward with the fast GEMMs and row-wise attention (what non-Llama targets get)."""
    return Target.load(str(tiny_target_dir), gemm="onednn", widths=(1, 2, 3, 5), decoder="transformers")


@pytest.fixture(scope="module")
def eager(tiny_target_dir):
    return Target.load(str(tiny_target_dir), gemm="mkl", warmup=False)


@pytest.fixture(params=["static", "transformers"])
def fast_path(request):
    return request.getfixturevalue("fast" if request.param == "static" else "hf_fast")


def logits_of(target, seq):
    """Logits [len(seq), V] of a fresh scratch session fed ``seq`` in one forward, through the target's path."""
    session = TargetSession("scratch", target._new_cache(), 0, -1, SamplingParams(), torch.Generator())
    return target._forward(session, seq)


needs_onednn = pytest.mark.skipif(not fast_linear.onednn_available(), reason="no oneDNN in this torch build")


@needs_onednn
def test_fast_paths_are_installed_and_eager_is_not(fast, hf_fast, eager):
    assert fast.decoder is not None and fast.gemm == "onednn" and fast.attention == "static, rows exact"
    assert fast.decoder.rows_independent
    assert any(isinstance(m, fast_linear.FastLinear) for m in fast.decoder.linears.modules())
    assert not any(isinstance(m, fast_linear.FastLinear) for m in fast.model.modules())   # the model stays plain
    assert hf_fast.decoder is None and hf_fast.attention == "tandem_rowwise"
    assert any(isinstance(m, fast_linear.FastLinear) for m in hf_fast.model.modules())
    assert eager.decoder is None and eager.gemm == "mkl"
    assert not any(isinstance(m, fast_linear.FastLinear) for m in eager.model.modules())
    # tied / shared parameters stay the model's own
    assert fast.model.get_output_embeddings().weight is fast.model.lm_head.weight


@needs_onednn
def test_logits_match_eager(fast_path, eager):
    seq = [1, 5, 9, 14, 3, 22, 40, 7, 63, 11]
    with torch.inference_mode():
        want = eager.model(torch.tensor([seq])).logits[0]
    assert torch.max(torch.abs(logits_of(fast_path, seq) - want)).item() <= 1e-4
    # the static decoder's q/k/v and gate/up weights are views of its merged weights: the model still works
    with torch.inference_mode():
        assert torch.max(torch.abs(fast_path.model(torch.tensor([seq])).logits[0] - want)).item() <= 1e-4


@needs_onednn
def test_greedy_decoding_identical_to_eager(fast_path, eager):
    for i, prompt in enumerate(([1, 5, 9, 14], [1, 30, 31, 2, 8], [1] + list(range(3, 40)))):
        assert greedy_plain(fast_path, prompt, 24, f"f{i}") == greedy_plain(eager, prompt, 24, f"e{i}")


@needs_onednn
def test_rows_bit_identical_across_widths(fast_path):
    """A token's logits in a width-w block equal a plain (width-1) step's, bit for bit."""
    prompt, more = [1, 5, 9, 14, 3], [22, 40, 7, 63, 11]
    fast_path.start("w", prompt, SamplingParams())
    session = fast_path.sessions.get("w")
    base = session.length
    with torch.inference_mode():
        plain = []
        for tok in more:
            plain.append(fast_path._forward(session, [tok])[0])
        session.rollback(base)
        for w in (2, 3, 5):
            block = fast_path._forward(session, more[:w])
            session.rollback(base)
            for i in range(w):
                assert torch.equal(block[i], plain[i]), (w, i)
    fast_path.end("w")


@needs_onednn
def test_speculative_greedy_equals_plain(fast_path):
    """Drafting the target's own continuation (all accepted) and a wrong one (rejections) reproduces plain decoding."""
    prompt = [1, 5, 9, 14, 3]
    want = greedy_plain(fast_path, prompt, 20, "p")
    first, _ = fast_path.start("s", prompt, SamplingParams())
    got = [first]
    while len(got) < 20:
        pos = len(got)
        draft = want[pos:pos + 3] if pos % 2 else [(t + 1) % 64 for t in want[pos:pos + 3]]
        out = fast_path.verify("s", [DraftToken(t) for t in draft])
        got += draft[:out.accepted] + [out.next_token]
    fast_path.end("s")
    assert got[:20] == want


@needs_onednn
def test_rollback_after_partial_accept(fast_path):
    prompt = [1, 5, 9, 14, 3]
    first, _ = fast_path.start("r", prompt, SamplingParams())
    with torch.inference_mode():
        nxt = int(fast_path.model(torch.tensor([prompt + [first]])).logits[0, -1].argmax())
    out = fast_path.verify("r", [DraftToken(nxt), DraftToken((nxt + 1) % 64), DraftToken(7)])
    session = fast_path.sessions.get("r")
    assert out.accepted == 1 and session.length == session.cache.get_seq_length() == len(prompt) + 2
    probe = fast_path._forward(session, [out.next_token, 11])
    with torch.inference_mode():
        fresh = fast_path.model(torch.tensor([prompt + [first, nxt, out.next_token, 11]])).logits[0, -2:]
    assert torch.max(torch.abs(probe - fresh)).item() <= 1e-4
    fast_path.end("r")


@needs_onednn
def test_static_cache_grows_past_its_capacity_and_prefill_chunks_agree(tiny_target_dir, eager, monkeypatch):
    """A cache that starts at 4 positions grows while a 100-token prompt is prefilled in chunks of 40 (masked
    block forwards after cached positions) and decoded; the tokens are the eager model's."""
    monkeypatch.setattr(kv_cache, "CACHE_STEP", 4)
    target = Target.load(str(tiny_target_dir), gemm="onednn", widths=(1, 2), prefill_chunk=40, warmup=False)
    cache = target.decoder.new_cache()
    assert cache.capacity == 4
    prompt = [1] + [3 + (7 * i) % 61 for i in range(99)]
    assert greedy_plain(target, prompt, 16, "g") == greedy_plain(eager, prompt, 16, "e")
    target.start("kept", prompt, SamplingParams())
    grown = target.sessions.get("kept").cache
    assert grown.length == len(prompt) and grown.capacity >= len(prompt)
    assert target.sessions.get("kept").kv_bytes() == grown.nbytes() > 0
    with pytest.raises(ValueError, match="context"):
        grown.reserve(10_000)


@needs_onednn
def test_batched_rows_stay_close_to_eager(tiny_target_dir, eager):
    """``exact_rows`` off (``--exact-rows off``): a block's rows in one masked SDPA call, equal up to rounding."""
    target = Target.load(str(tiny_target_dir), gemm="onednn", widths=(1, 2), warmup=False, rowwise_attention=False)
    assert target.attention == "static, rows batched" and not target.decoder.rows_independent
    seq = [1, 5, 9, 14, 3, 22, 40, 7, 63, 11]
    with torch.inference_mode():
        want = eager.model(torch.tensor([seq])).logits[0]
    assert torch.max(torch.abs(logits_of(target, seq) - want)).item() <= 1e-4


def test_models_the_static_decoder_cannot_run_keep_transformers(tiny_target_dir):
    from tandem.models import load_causal_lm

    model, tokenizer, _ = load_causal_lm(str(tiny_target_dir))
    model.config.model_type = "gpt_neox"
    assert "gpt_neox" in static_decoder.unsupported_reason(model)
    target = Target(model, tokenizer, "odd", gemm="auto", widths=(1, 2), warmup=False)
    assert target.decoder is None and "transformers' forward" in target.gemm_note
    assert greedy_plain(target, [1, 5, 9], 5, "o")
    with pytest.raises(ValueError, match="decoder='static' cannot run odd"):
        Target(model, tokenizer, "odd", decoder="static", warmup=False)


@needs_onednn
def test_auto_measures_and_installs_its_choice(tiny_target_dir):
    target = Target.load(str(tiny_target_dir), widths=(1, 2), warmup=False)
    assert target.gemm_choice is not None and set(target.gemm_choice.table) == {1, 2}
    assert target.decoder is not None and target.gemm_choice is target.decoder.gemm_choice
    # the kernel each linear runs at each row count (MKL everywhere leaves plain nn.Linear modules)
    kernels = {m.kernel_for(r) if isinstance(m, fast_linear.FastLinear) else fast_linear.MKL
               for m in target.decoder.linears.modules() if isinstance(m, (torch.nn.Linear, fast_linear.FastLinear))
               for r in (1, 2)}
    assert kernels == {target.gemm_choice.choice[1], target.gemm_choice.choice[2]}
    assert greedy_plain(target, [1, 5, 9], 5, "a")


def test_choice_falls_back_to_mkl_without_onednn(tiny_target_dir, monkeypatch):
    monkeypatch.setattr(fast_linear, "onednn_available", lambda: False)
    choice = fast_linear.choose_gemm(Target.load(str(tiny_target_dir), gemm="mkl", warmup=False).model, [1, 2],
                                     repeats=1)
    assert set(choice.choice.values()) == {"mkl"} and choice.notes
    target = Target.load(str(tiny_target_dir), widths=(1, 2), warmup=False)
    assert target.gemm == "mkl" and not any(isinstance(m, fast_linear.FastLinear) for m in target.model.modules())
    assert greedy_plain(target, [1, 5, 9], 5, "m")


@needs_onednn
def test_choose_gemm_table_and_kernels(fast):
    choice = fast_linear.choose_gemm(fast.model, [1, 3], repeats=2)
    assert set(choice.table) == {1, 3} and all(set(t) == {"mkl", "onednn"} for t in choice.table.values())
    assert all(ms > 0 for t in choice.table.values() for ms in t.values())
    assert set(choice.choice.values()) <= {"mkl", "onednn"} and "w=1" in choice.describe()
    assert choice.uniform                            # one kernel at every width: rows independent of the width
    per_width = fast_linear.choose_gemm(fast.model, [1, 3], repeats=2, uniform=False)
    assert set(per_width.choice) == {1, 3}


def test_warmup_fills_the_cost_table(fast):
    table = fast.cost_table()
    assert set(table) == {1, 2, 3, 5} and all(ms > 0 for ms in table.values())
    again = fast.warmup([1, 4], repeats=1)
    assert set(again) == {1, 4} and set(fast.cost_table()) == {1, 2, 3, 4, 5}
    assert len(fast.sessions) == 0          # the scratch session is never stored


def test_chunked_prefill_matches_one_shot(tiny_target_dir, eager):
    chunked = Target.load(str(tiny_target_dir), gemm="mkl", warmup=False, prefill_chunk=4)
    prompt = [1] + list(range(3, 30))
    assert greedy_plain(chunked, prompt, 12, "c") == greedy_plain(eager, prompt, 12, "o")


def test_cancelled_prefill_stops_and_keeps_no_session(tiny_target_dir):
    target = Target.load(str(tiny_target_dir), gemm="mkl", warmup=False, prefill_chunk=4)
    calls = []
    real = target._forward
    target._forward = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
    checks = iter([False, False, True])
    with pytest.raises(PrefillCancelled):
        target.start("x", list(range(3, 30)), SamplingParams(), cancelled=lambda: next(checks))
    assert len(calls) == 2 and "x" not in target.sessions
    event = threading.Event()
    event.set()
    with pytest.raises(PrefillCancelled):
        target.start("y", [1, 2, 3], SamplingParams(), cancelled=event)


def test_prefill_chunks_let_other_sessions_step_in_between(tiny_target_dir):
    """While one session prefills chunk by chunk, a verify waiting for the (FIFO) forward lock runs right
    after the current chunk, not after the whole prompt."""
    target = Target.load(str(tiny_target_dir), gemm="mkl", warmup=False, prefill_chunk=2)
    target.start("short", [1, 5, 9], SamplingParams())
    rows = []                       # input rows of each forward, recorded inside the lock
    in_long, release = threading.Event(), threading.Event()

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        rows.append(int(ids.shape[1]))
        if len(rows) == 1:          # the long prompt's first chunk: hold the lock until verify waits
            in_long.set()
            release.wait(5)

    handle = target.model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        t = threading.Thread(target=target.start, args=("long", list(range(3, 23)), SamplingParams()))
        t.start()
        assert in_long.wait(5)
        v = threading.Thread(target=target.verify, args=("short", []))
        v.start()
        time.sleep(0.3)             # verify is now queued on the forward lock
        release.set()
        v.join(10)
        t.join(10)
    finally:
        handle.remove()
    assert rows.count(2) == 10 and rows[:2] == [2, 1]
