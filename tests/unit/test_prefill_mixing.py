"""A prompt prefilled while other sessions decode rides along in their verify forwards (the scheduler's
``mix_rows``) instead of stalling them a chunk at a time, and the rows it gets so are the rows it gets alone.
The rule is driven with a fake clock and runner; the exactness through a real Target on a tiny GGUF file
with int8 activations on the x8 kernels (the path where it is on)."""

from __future__ import annotations

import pytest
import torch

from scheduler_fakes import Clock, Session, come_back
from tandem.bench.random_gguf import write
from tandem.types import SamplingParams
from tiny_models import make_tokenizer
from verifier_service import native
from verifier_service.gguf_model import GgufModel
from verifier_service.scheduler import PrefillWork, Runner, Scheduler
from verifier_service.target import MIX_ROWS, Target


class Recorder(Runner):
    """Each forward takes 5 ms plus 0.5 ms a row of the fake clock; decoding sessions send their next block at
    once (while ``rounds`` last); prompts advance by the rows they were given."""

    def __init__(self, clock: Clock, scheduler_of, rounds: int):
        self.clock, self.scheduler_of, self.rounds = clock, scheduler_of, rounds
        self.forwards = []                                # (kind, verify sessions, prompt rows)

    def run_verify(self, batch, ahead=(), mixed=None):
        rows = sum(w.rows for w in batch) + (mixed[1] if mixed else 0)
        self.clock.t += 0.005 + 0.0005 * rows
        self.forwards.append(("verify", sorted(w.session.session_id for w in batch), mixed[1] if mixed else 0))
        if mixed:
            self._advance(*mixed)
        for work in batch:
            work.future.set_result(None)
        self.rounds -= 1
        if self.rounds > 0:
            for work in batch:
                come_back(self.scheduler_of(), work.session, work.draft)

    def run_prefill(self, work, chunk):
        n = min(chunk, len(work.prompt_ids) - work.done)
        self.clock.t += 0.005 + 0.0005 * n
        self.forwards.append(("prefill", [], n))
        self._advance(work, n)

    @staticmethod
    def _advance(work, n):
        work.done += n
        if work.done >= len(work.prompt_ids):
            work.future.set_result(0)


def run_until_idle(scheduler, clock, limit=200) -> None:
    for _ in range(limit):
        what, work, wait = scheduler._decide(clock())
        if what is None:
            if wait is None:
                return
            clock.t += wait
            continue
        scheduler._run(what, work)
        scheduler._last_forward_end = clock()
        if what == "prefill" and work.future.done():
            scheduler._prefill.remove(work)
        elif what == "verify" and work[2] and work[2][0].future.done():
            scheduler._prefill.remove(work[2][0])
    raise AssertionError("the scheduler never went idle")


def scheduler_with(mix_rows: int, rounds: int, draft=()):
    clock = Clock()
    scheduler = Scheduler(None, prefill_chunk=32, mix_rows=mix_rows, clock=clock)
    scheduler.runner = Recorder(clock, lambda: scheduler, rounds)
    sessions = [Session(n) for n in "ab"]
    for s in sessions:
        come_back(scheduler, s, draft)
    prompt = PrefillWork(Session("p"), prompt_ids=list(range(70)))
    scheduler._catch_up(prompt.session)
    scheduler._prefill.append(prompt)
    return clock, scheduler, prompt


def test_a_prompt_rides_along_in_the_decoding_sessions_forwards():
    clock, scheduler, prompt = scheduler_with(mix_rows=16, rounds=20)
    run_until_idle(scheduler, clock)
    forwards = scheduler.runner.forwards
    assert prompt.future.done() and prompt.done == 70
    assert all(kind == "verify" for kind, *_ in forwards), forwards          # never a chunk of its own
    riding = [rows for kind, _, rows in forwards if rows]
    assert sum(riding) == 70 and max(riding) == 14                            # 16 rows a forward, 2 of them verify
    assert all(sessions == ["a", "b"] for _, sessions, _ in forwards[:len(riding)])   # nobody waited for it


def test_without_mixing_the_prompt_takes_chunks_of_its_own():
    clock, scheduler, prompt = scheduler_with(mix_rows=0, rounds=20)
    run_until_idle(scheduler, clock)
    chunks = [rows for kind, _, rows in scheduler.runner.forwards if kind == "prefill"]
    assert chunks == [32, 32, 6] and prompt.future.done()


def test_a_prompt_is_not_starved_where_the_verify_rows_leave_no_room():
    """Blocks of 8 rows a session fill the 16 rows: the prompt gets its chunks alone, by its clock."""
    clock, scheduler, prompt = scheduler_with(mix_rows=16, rounds=40, draft=tuple(range(7)))
    run_until_idle(scheduler, clock)
    forwards = scheduler.runner.forwards
    assert prompt.future.done()
    assert [rows for kind, _, rows in forwards if kind == "prefill"] == [32, 32, 6]
    first_chunk = next(i for i, f in enumerate(forwards) if f[0] == "prefill")
    assert first_chunk < 10                                                  # served by its clock, not last


# ---- a real target ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def int8_file(tmp_path_factory):
    if native.library() is None or native.isa() not in native.X8_ISAS:
        pytest.skip("no x8 int8 kernels on this path")
    return write(tmp_path_factory.mktemp("mix") / "q4_1.gguf", arch="llama", std=0.3, kinds={"default": "Q4_1"},
                 seed=4)


def int8_target(path, monkeypatch, **kw) -> Target:
    monkeypatch.setenv("TANDEM_ACTIVATIONS", "int8")
    return Target(GgufModel(path), make_tokenizer(260), path.stem, widths=(1, 2), warmup=False, prefill_chunk=-1,
                  **kw)


def greedy_alone(path, monkeypatch, prompt, n) -> list[int]:
    target = int8_target(path, monkeypatch, mix_rows=0)
    out = [target.start("alone", prompt, SamplingParams())[0]]
    while len(out) < n:
        out.append(target.verify("alone", []).next_token)
    return out


def test_a_prompt_prefilled_in_slices_beside_a_decoding_session_gets_its_tokens_alone(int8_file, monkeypatch):
    torch.manual_seed(0)
    target = int8_target(int8_file, monkeypatch)
    assert target.mixes_prefill and target.scheduler.mix_rows == MIX_ROWS
    assert int8_target(int8_file, monkeypatch, mix_rows=5).scheduler.mix_rows == 5
    monkeypatch.setenv("TANDEM_ACTIVATIONS", "fp32")
    fp32 = Target(GgufModel(int8_file), make_tokenizer(260), "fp32", widths=(1,), warmup=False, prefill_chunk=-1)
    assert not fp32.mixes_prefill and fp32.scheduler.mix_rows == 0          # 256-token chunks: torch's GEMM

    a_prompt = [(5 * i + 1) % 260 for i in range(11)]
    b_prompt = [(7 * i + 3) % 260 for i in range(45)]
    a_alone = greedy_alone(int8_file, monkeypatch, a_prompt, 12)
    b_alone = greedy_alone(int8_file, monkeypatch, b_prompt, 6)

    a_out = [target.start("a", a_prompt, SamplingParams())[0]]
    work = target._prefill_work("b", b_prompt, SamplingParams(), "", 0, None)
    for n in (9, 13, 1, 22):                        # slices of any size, each beside one step of session a
        target.run_verify([target._verify_work("a", [], None)], (), (work, n))
        a_out.append(target.sessions.require("a").pending_token)
    assert work.future.done() and work.done == len(b_prompt)
    b_out = [target._started(work, "", 0.0)[0]]
    while len(b_out) < 6:
        b_out.append(target.verify("b", []).next_token)
    while len(a_out) < 12:
        a_out.append(target.verify("a", []).next_token)
    assert b_out == b_alone and a_out == a_alone


def test_a_prompt_waits_for_a_session_that_does_not_come_back_only_the_batch_wait():
    """The last forward's session is ending (its client got the last token): a new prompt waits at most the
    batch wait for it, not the whole hold, then goes on its own (a single client's next request)."""
    clock, scheduler, prompt = scheduler_with(mix_rows=16, rounds=1)
    scheduler._prefill.clear()
    what, work, _ = scheduler._decide(clock())
    scheduler._run(what, work)                                  # a and b verify; nobody comes back
    scheduler._last_forward_end = clock()
    assert scheduler._expected
    scheduler._catch_up(prompt.session)
    scheduler._prefill.append(prompt)
    what, _, wait = scheduler._decide(clock())
    assert what is None and 0 < wait <= 0.25 * scheduler._last_verify_s + 1e-9
    clock.t += wait
    what, work, _ = scheduler._decide(clock())
    assert what == "prefill" and work is prompt
