"""Which forward the verifier runs next: verify blocks of many sessions batched into one forward, prefill
chunks interleaved with them fairly.

Work arrives from any thread (gRPC handlers, a gateway in the same process) as an item with a future:
  * ``VerifyWork``: one session's block [pending, x_1..x_k], k + 1 rows;
  * ``PrefillWork``: one session's whole prompt, run a chunk (``prefill_chunk`` tokens) per forward.
The torch thread (``torch_thread``) runs them, one forward a step, through a ``Runner`` (the ``Target``):
  * a verify batch: the verify items waiting, FIFO, one per session, up to ``max_batch_rows`` rows and
    ``max_batch_sessions`` sessions (the first item always fits), in ONE forward over all their rows
    (continuous batching: whoever is waiting when a forward ends joins the next one); or
  * one prefill chunk of one prefill item.
After each step the scheduler goes to the back of the torch thread's queue, so other torch work (loading,
tests) interleaves.

Fairness: each session has a clock, ``vtime`` (ms), advanced by the wall time of every forward it is part
of (a verify batch counts in full for each of its sessions; a chunk for its prefill). A step serves the
lowest clock: a prefill chunk when its session's clock is below those of every session waiting to verify,
else the verify batch. Verify batches and chunks of long prompts so share the machine about equally, and
several prompts prefill in turn. A session that arrives, or comes back after being idle, starts ``credit``
(the last full chunk's time) behind the lowest clock served so far: a short request is served for a chunk's
time of its own before a long prefill's next chunk may interrupt it, so it waits for at most the chunk
already running, not one chunk per round.

The sessions of the last verify batch are expected back within ``hold_ms`` (the gateway's turnaround
between rounds). While one of them is ahead in the share, a prefill chunk waits for it (at most until the
hold ends): otherwise each round would find the verify queue momentarily empty, a chunk would start, and
every round would wait a whole chunk. ``batch_wait_ms`` > 0 likewise holds a verify batch that long after
the previous forward for the sessions still expected, so the batch stays whole instead of splitting into
two groups that alternate. By default (``batch_wait_ms`` < 0) that hold is a quarter of the last verify
forward's time (``BATCH_WAIT_SHARE``): the sessions of a batch come back a few ms apart (each reply goes
through the gateway's round and the wire), and without the hold the first one back starts a forward of its
own while the others queue behind it, so the batch splits in two for good. A quarter bounds the time a batch
can lose waiting for a session that does not come back; it ends as soon as every expected session is back.

Prefill slices in verify forwards (``mix_rows`` > 0, where the runner computes a prompt's rows the same in
any forward: exact rows, so a slice's K/V are the bits a chunk of its own would write). While sessions
decode, a waiting prompt is not prefilled in chunks of its own, each of which stalls every decoding session
for a chunk's time: its next rows ride along in the verify forwards instead, filling each forward up to
``mix_rows`` rows (at most ``prefill_chunk`` of them), and the session's clock advances with those forwards.
A decoding session's round then costs a somewhat wider forward, never a chunk plus its own forward (the
stall-free batching of Sarathi-Serve, Agrawal et al., OSDI 2024). Chunks of their own remain where nobody
decodes, and where the verify rows leave no room (a prompt whose clock is then the lowest gets its chunk, as
above, so it is never starved).

The pending row ahead: a session's next block always starts with its pending token (the last token it
emitted), known as soon as its round is settled. Where the runner allows it (``wants_ahead``: exact rows,
so a block's row is the same computed alone), the sessions expected back get that row computed while
their reply crosses the wire and the gateway prepares the next round: a forward of those rows runs when
the scheduler would otherwise wait (or joins the next verify batch). A plain step that then arrives needs
no forward at all; a draft block needs only its drafted rows. Nothing is ever computed twice: the row is
the first row of whatever block comes next, and only a session that ends without another round leaves
one unused.

Nothing here knows about models: the ``Runner`` runs a batch or a chunk and says how it went.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from verifier_service import torch_thread

log = logging.getLogger(__name__)

HOLD_MS = 20.0           # how long a prefill chunk waits for a session of the last verify batch to come back
BATCH_WAIT_SHARE = 0.25  # the default batch wait: this share of the last verify forward's time


@dataclass(eq=False)
class Work:
    """One item of work: its session (anything with ``vtime`` and ``session_id``), the future its caller waits
    on, and when it was submitted (perf_counter, and wall-clock ns for spans)."""

    session: object
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    submitted: float = field(default_factory=time.perf_counter)
    submitted_ns: int = field(default_factory=time.time_ns)

    def wall_ns(self, perf: float) -> int:
        """perf_counter time ``perf`` as wall-clock ns (for spans recorded after the fact)."""
        return self.submitted_ns + int((perf - self.submitted) * 1e9)


@dataclass(eq=False)
class VerifyWork(Work):
    draft: Sequence = ()
    base: int = 0                              # the session's length when its forward ran
    timing: tuple = ()                         # (forward start, forward end, acceptance end, rows, sessions)

    @property
    def rows(self) -> int:
        """Rows this block adds to a forward: its drafts, and its pending token unless computed ahead."""
        return len(self.draft) + (0 if getattr(self.session, "ahead", None) is not None else 1)


@dataclass(eq=False)
class PrefillWork(Work):
    prompt_ids: Sequence[int] = ()
    done: int = 0                              # prompt tokens prefilled so far
    chunks: int = 0
    cancelled: Callable[[], bool] = lambda: False
    started: float | None = None               # perf_counter of its first chunk
    prefix: object = None                      # K/V of its first ``done`` tokens to copy (prefix_cache.Hit)
    reused: int = 0                            # prompt tokens taken from the prefix cache


@dataclass(frozen=True)
class Forward:
    """What one step ran, for metrics: a verify batch (``rows`` rows of ``sessions`` sessions) or a prefill chunk;
    its wall time; the queue wait of each item in it."""

    kind: str                                  # "verify" or "prefill"
    rows: int
    sessions: int
    ms: float
    queue_ms: tuple[float, ...]


class Runner:
    """What the scheduler needs from the target."""

    def run_verify(self, batch: list[VerifyWork], ahead: Sequence = (), mixed: tuple | None = None) -> None:
        """One forward over every item's rows (and the pending row of each session of ``ahead``, and where
        ``mixed`` = (prefill work, rows) the next ``rows`` of that prompt, advancing ``work.done`` and completing
        its future once the prompt is done), then each item's acceptance; completes every future."""

    def wants_ahead(self, session) -> bool:
        """True when ``session``'s pending row may be computed ahead of its next block (see the module
        docstring): False by default."""
        return False

    def run_prefill(self, work: PrefillWork, chunk: int) -> None:
        """The next chunk of ``work`` (at most ``chunk`` tokens, advancing ``work.done``); completes the future
        once the prompt is done, or with an exception on failure or cancellation."""


class Scheduler:
    def __init__(self, runner: Runner, *, prefill_chunk: int = 256, max_batch_rows: int = 32,
                 max_batch_sessions: int = 64, batch_wait_ms: float = -1.0, hold_ms: float = HOLD_MS,
                 mix_rows: int = 0, clock: Callable[[], float] = time.perf_counter):
        self.runner = runner
        self.prefill_chunk = int(prefill_chunk or 0)
        self.max_batch_rows = max(1, int(max_batch_rows))
        self.max_batch_sessions = max(1, int(max_batch_sessions))
        self.mix_rows = min(max(0, int(mix_rows)), self.max_batch_rows)   # 0: prefill chunks only on their own
        self.batch_wait_s = None if batch_wait_ms < 0 else float(batch_wait_ms) / 1e3   # None: the share
        self._last_verify_s = 0.0
        self.hold_s = max(0.0, float(hold_ms)) / 1e3
        self.clock = clock
        self._listeners: list = []                    # weak references: called on the torch thread after each forward
        self._cond = threading.Condition()
        self._verify: collections.deque[VerifyWork] = collections.deque()
        self._prefill: list[PrefillWork] = []
        self._expected: dict[object, float] = {}      # session -> until when it is expected back (perf_counter)
        self._last_forward_end = 0.0
        self._vclock = 0.0                            # the lowest clock served so far (never goes back)
        self.credit_ms = 0.0                          # the last full prefill chunk's time
        self._scheduled = False                       # a step is queued or running on the torch thread

    # ---- submitting ----------------------------------------------------------------------------------
    def submit(self, work: Work) -> concurrent.futures.Future:
        """Queues ``work``; returns its future. On the torch thread itself it runs at once (a batch of one)."""
        if torch_thread.on_torch_thread():
            self._run_inline(work)
            return work.future
        with self._cond:
            self._catch_up(work.session)
            if isinstance(work, VerifyWork):
                self._verify.append(work)
                self._expected.pop(work.session, None)
            else:
                self._prefill.append(work)
            self._cond.notify()
            if not self._scheduled:
                self._scheduled = True
                torch_thread.submit(self._step)
        return work.future

    def add_listener(self, fn: Callable[[Forward], None]) -> None:
        """Calls ``fn(Forward)`` after each forward, on the torch thread, for as long as ``fn``'s object lives."""
        ref = weakref.WeakMethod(fn) if hasattr(fn, "__self__") else (lambda: fn)
        with self._cond:
            self._listeners.append(ref)

    def forget(self, session) -> None:
        """The session ended: nobody waits for it to come back."""
        with self._cond:
            if self._expected.pop(session, None) is not None:
                self._cond.notify()

    def pending(self) -> tuple[int, int]:
        """(verify items, prefill items) waiting."""
        with self._cond:
            return len(self._verify), len(self._prefill)

    def _catch_up(self, session) -> None:
        """A session (new, or back after being idle) starts at most ``credit`` behind the clock served so far."""
        floor = self._vclock - self.credit_ms
        if getattr(session, "vtime", None) is None or session.vtime < floor:
            session.vtime = floor

    # ---- choosing ------------------------------------------------------------------------------------
    def _decide(self, now: float) -> tuple[str | None, object, float | None]:
        """(what, work, wait): ("verify", (batch, ahead sessions), None), ("prefill", work, None), (None, None,
        seconds to wait for a session expected back), or (None, None, None): nothing to do. Called with the
        lock held."""
        self._expected = {s: until for s, until in self._expected.items() if until > now}
        prefill = min(self._prefill, key=lambda w: w.session.vtime) if self._prefill else None
        verify_low = min((w.session.vtime for w in self._verify), default=float("inf"))
        expected_low = min((s.vtime for s in self._expected), default=float("inf"))
        wait_s = self.batch_wait_s if self.batch_wait_s is not None else BATCH_WAIT_SHARE * self._last_verify_s
        gather_until = self._last_forward_end + wait_s
        # a prompt rides along while sessions verify, or are due back from the last forward (those that do not
        # come back within the batch wait are ending: the prompt then goes on its own)
        rides = (self.mix_rows > 0 and (self._verify or (self._expected and now < gather_until))
                 and sum(w.rows for w in self._verify) < self.mix_rows)
        if prefill is not None and prefill.session.vtime < min(verify_low, expected_low) and not rides:
            return "prefill", prefill, None
        ahead = [s for s in self._expected if self.runner.wants_ahead(s)]
        if self._verify:
            if not ahead and self._expected and now < gather_until and self._room_for_expected():
                return None, None, gather_until - now
            batch = self._take_batch()
            rows = sum(w.rows for w in batch)
            fit = self._fit_ahead(ahead, rows, len(batch))
            return "verify", (batch, fit, self._slice(prefill, rows + len(fit), len(batch) + len(fit))), None
        if ahead:                             # instead of waiting: the rows the sessions' next blocks start with
            fit = self._fit_ahead(ahead, 0, 0)
            return "verify", ([], fit, self._slice(prefill, len(fit), len(fit))), None
        if prefill is not None:               # a session ahead of it in the share is expected back
            return None, None, min(self._expected.values()) - now if not rides else gather_until - now
        return None, None, None

    def _fit_ahead(self, sessions: list, rows: int, count: int) -> list:
        """The sessions whose pending rows fit beside a batch of ``rows`` rows of ``count`` sessions."""
        room = min(self.max_batch_rows - rows, self.max_batch_sessions - count)
        return sessions[:max(0, room)]

    def _slice(self, prefill: PrefillWork | None, rows: int, count: int) -> tuple | None:
        """(prefill, rows) of the prompt that ride along in a forward of ``rows`` rows of ``count`` sessions
        (``mix_rows``), or None."""
        if prefill is None or self.mix_rows <= 0 or count >= self.max_batch_sessions:
            return None
        room = min(self.mix_rows - rows, len(prefill.prompt_ids) - prefill.done,
                   self.prefill_chunk or self.mix_rows)
        return (prefill, room) if room > 0 else None

    def _room_for_expected(self) -> bool:
        rows = sum(w.rows for w in self._verify)
        return rows < self.max_batch_rows and len(self._verify) < self.max_batch_sessions

    def _take_batch(self) -> list[VerifyWork]:
        """The verify items of this forward: FIFO, one per session, within the row and session bounds."""
        batch, rows, seen, left = [], 0, set(), collections.deque()
        for work in self._verify:
            fits = not batch or (rows + work.rows <= self.max_batch_rows and len(batch) < self.max_batch_sessions)
            if fits and id(work.session) not in seen:
                batch.append(work)
                rows += work.rows
                seen.add(id(work.session))
            else:
                left.append(work)
        self._verify = left
        return batch

    # ---- running -------------------------------------------------------------------------------------
    def _step(self) -> None:
        """One forward on the torch thread (or a short wait for a session expected back), then back in the
        torch thread's queue while work remains."""
        with self._cond:
            while True:
                what, work, wait = self._decide(self.clock())
                if what is not None:
                    break
                if wait is None:
                    self._scheduled = False
                    return
                self._cond.wait(max(wait, 1e-4))
            items = ([*work[0], work[2][0]] if work[2] else work[0]) if what == "verify" else [work]
            if items:
                self._vclock = max(self._vclock, min(w.session.vtime for w in items))
        try:
            report = self._run(what, work)
        except BaseException as exc:          # a bug in the runner: its callers hear of it, the others go on
            for w in items:
                if not w.future.done():
                    w.future.set_exception(exc)
            report = None
        with self._cond:
            done = work if what == "prefill" else (work[2][0] if work[2] else None)
            if done is not None and done.future.done() and done in self._prefill:
                self._prefill.remove(done)
            self._last_forward_end = self.clock()
            if self._verify or self._prefill or any(self.runner.wants_ahead(s) for s in self._expected):
                torch_thread.submit(self._step)
            else:
                self._scheduled = False
        if report is not None:
            for ref in list(self._listeners):
                listener = ref()
                if listener is None:
                    self._listeners.remove(ref)
                    continue
                try:
                    listener(report)
                except Exception:           # noqa: BLE001 - metrics must not stop the forwards
                    log.exception("scheduler listener failed")

    def _run(self, what: str, work) -> Forward:
        t0 = self.clock()
        if what == "verify":
            work, ahead, mixed = work
            queued = tuple((t0 - w.submitted) * 1e3 for w in work)
            rows = sum(w.rows for w in work) + len(ahead) + (mixed[1] if mixed else 0)
            if mixed:
                mixed[0].started = mixed[0].started or t0
            self.runner.run_verify(work, ahead, mixed)
            t1 = self.clock()
            ms = (t1 - t0) * 1e3
            with self._cond:
                if work:
                    self._last_verify_s = t1 - t0
                back = {id(v.session) for v in self._verify}   # sent their next block while this one settled
                for session in ahead:
                    session.vtime += ms
                for w in work:
                    w.session.vtime += ms
                    if w.future.done() and w.future.exception() is None and id(w.session) not in back:
                        self._expected[w.session] = t1 + self.hold_s
                if mixed:
                    mixed[0].session.vtime += ms
                    if mixed[0].future.done() and mixed[0].future.exception() is None:   # its first round next
                        self._expected[mixed[0].session] = t1 + self.hold_s
            return Forward("verify", rows, len(work) + len(ahead) + (1 if mixed else 0), ms, queued)
        queued = ((t0 - work.submitted) * 1e3,) if work.started is None else ()
        work.started = work.started or t0
        before = work.done
        self.runner.run_prefill(work, self.prefill_chunk or len(work.prompt_ids))
        t1 = self.clock()
        ms = (t1 - t0) * 1e3
        rows = work.done - before
        with self._cond:
            work.session.vtime += ms
            if rows >= self.prefill_chunk > 0:
                self.credit_ms = ms
            if work.future.done() and work.future.exception() is None:   # its first round comes next
                self._expected[work.session] = t1 + self.hold_s
        return Forward("prefill", rows, 1, ms, queued)

    def _run_inline(self, work: Work) -> None:
        """``work`` run now, alone (the caller is on the torch thread: warm-up, tests)."""
        if isinstance(work, VerifyWork):
            self.runner.run_verify([work])
        else:
            while not work.future.done():
                self.runner.run_prefill(work, self.prefill_chunk or len(work.prompt_ids))
