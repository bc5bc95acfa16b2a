"""The verifier's fast forward path (verifier_service.fast_linear + forward): same math as transformers'
eager forward, rows bit-identical across block widths, rollback, the GEMM choice, warm-up, chunked prefill."""

import threading
import time

import pytest
import torch

from tandem.types import DraftToken, SamplingParams
from verifier_service import fast_linear
from verifier_service.target import PrefillCancelled, Target


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def fast(tiny_target_dir):
    # "onednn" forced: on a 32-wide tiny model the measurement ("auto") may well pick MKL
    return Target.load(str(tiny_target_dir), gemm="onednn", widths=(1, 2, 3, 5))


@pytest.fixture(scope="module")
def eager(tiny_target_dir):
    return Target.load(str(tiny_target_dir), gemm="mkl", warmup=False)


def greedy_plain(target, prompt, n, sid):
    """n greedy tokens by plain decoding (empty drafts: one width-1 forward per token)."""
    first, _ = target.start(sid, prompt, SamplingParams())
    out = [first]
    while len(out) < n:
        out.append(target.verify(sid, []).next_token)
    target.end(sid)
    return out


needs_onednn = pytest.mark.skipif(not fast_linear.onednn_available(), reason="no oneDNN in this torch build")


@needs_onednn
def test_fast_path_is_installed_and_eager_is_not(fast, eager):
    assert fast.gemm == "onednn" and fast.attention == "tandem_rowwise"
    assert any(isinstance(m, fast_linear.FastLinear) for m in fast.model.modules())
    assert eager.gemm == "mkl" and not any(isinstance(m, fast_linear.FastLinear) for m in eager.model.modules())
    # tied / shared parameters stay the model's own
    assert fast.model.get_output_embeddings().weight is fast.model.lm_head.weight


@needs_onednn
def test_logits_match_eager(fast, eager):
    seq = torch.tensor([[1, 5, 9, 14, 3, 22, 40, 7, 63, 11]])
    with torch.inference_mode():
        a = fast.model(seq).logits
        b = eager.model(seq).logits
    assert torch.max(torch.abs(a - b)).item() <= 1e-4


@needs_onednn
def test_greedy_decoding_identical_to_eager(fast, eager):
    for i, prompt in enumerate(([1, 5, 9, 14], [1, 30, 31, 2, 8], [1] + list(range(3, 40)))):
        assert greedy_plain(fast, prompt, 24, f"f{i}") == greedy_plain(eager, prompt, 24, f"e{i}")


@needs_onednn
def test_rows_bit_identical_across_widths(fast):
    """A token's logits in a width-w block equal a plain (width-1) step's, bit for bit."""
    prompt, more = [1, 5, 9, 14, 3], [22, 40, 7, 63, 11]
    fast.start("w", prompt, SamplingParams())
    session = fast.sessions.get("w")
    base = session.length
    with torch.inference_mode():
        plain = []
        for tok in more:
            plain.append(fast._forward(session, [tok])[0])
        session.rollback(base)
        for w in (2, 3, 5):
            block = fast._forward(session, more[:w])
            session.rollback(base)
            for i in range(w):
                assert torch.equal(block[i], plain[i]), (w, i)
    fast.end("w")


@needs_onednn
def test_speculative_greedy_equals_plain(fast):
    """Drafting the target's own continuation (all accepted) and a wrong one (rejections) reproduces plain decoding."""
    prompt = [1, 5, 9, 14, 3]
    want = greedy_plain(fast, prompt, 20, "p")
    first, _ = fast.start("s", prompt, SamplingParams())
    got = [first]
    while len(got) < 20:
        pos = len(got)
        draft = want[pos:pos + 3] if pos % 2 else [(t + 1) % 64 for t in want[pos:pos + 3]]
        out = fast.verify("s", [DraftToken(t) for t in draft])
        got += draft[:out.accepted] + [out.next_token]
    fast.end("s")
    assert got[:20] == want


@needs_onednn
def test_rollback_after_partial_accept(fast):
    prompt = [1, 5, 9, 14, 3]
    first, _ = fast.start("r", prompt, SamplingParams())
    with torch.inference_mode():
        nxt = int(fast.model(torch.tensor([prompt + [first]])).logits[0, -1].argmax())
    out = fast.verify("r", [DraftToken(nxt), DraftToken((nxt + 1) % 64), DraftToken(7)])
    session = fast.sessions.get("r")
    assert out.accepted == 1 and session.length == session.cache.get_seq_length() == len(prompt) + 2
    probe = fast._forward(session, [out.next_token, 11])
    with torch.inference_mode():
        fresh = fast.model(torch.tensor([prompt + [first, nxt, out.next_token, 11]])).logits[0, -2:]
    assert torch.max(torch.abs(probe - fresh)).item() <= 1e-4
    fast.end("r")


@needs_onednn
def test_auto_measures_and_installs_its_choice(tiny_target_dir):
    target = Target.load(str(tiny_target_dir), widths=(1, 2), warmup=False)
    assert target.gemm_choice is not None and set(target.gemm_choice.table) == {1, 2}
    installed = any(isinstance(m, fast_linear.FastLinear) for m in target.model.modules())
    assert installed == (target.gemm == "auto")
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
