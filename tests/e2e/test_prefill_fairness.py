"""Fairness between sessions on the real default target, through a real verifier service: the prefill of a
long prompt goes in chunks with other sessions' work between them, and a cancelled prefill stops at its
next chunk. Measured before chunking: an 8 000-token prefill took ~60 s while a concurrent "Hi" waited
58.7 s, and a client that gave up at 3 s left the verifier computing for ~50 s more."""

from __future__ import annotations

import os
import threading
import time

import grpc
import pytest

from harness import LoopThread
from tandem.pb import common_pb2, verifier_grpc, verifier_pb2

pytestmark = pytest.mark.integration

LONG = 3000            # prompt tokens: ~12 chunks of 256


@pytest.fixture(scope="module")
def service(default_target):
    from verifier_service.server import start_verifier

    lt = LoopThread()
    svc = lt.run(start_verifier(default_target))
    channel = grpc.insecure_channel(f"127.0.0.1:{svc.port}")
    yield default_target, verifier_grpc.VerifierStub(channel)
    channel.close()
    lt.run(svc.stop(0))
    lt.close()


def _start(stub, sid, n, timeout=600):
    t0 = time.perf_counter()
    stub.StartSession(verifier_pb2.StartSessionRequest(session_id=sid, prompt_ids=[(i * 7) % 30000 + 100
                                                                                   for i in range(n)]),
                      timeout=timeout)
    return time.perf_counter() - t0


def _chunk_time(stub) -> float:
    """The time of one 256-token prefill chunk, alone."""
    t = min(_start(stub, f"chunk{i}", 256) for i in range(2))
    for i in range(2):
        stub.EndSession(common_pb2.EndSessionRequest(session_id=f"chunk{i}"), timeout=30)
    return t


def test_a_short_request_is_served_between_the_chunks_of_a_long_prefill(service):
    target, stub = service
    chunk = _chunk_time(stub)
    alone = min(_start(stub, f"hi{i}", 8) for i in range(2))
    long_done = {}
    worker = threading.Thread(target=lambda: long_done.setdefault("s", _start(stub, "long", LONG)))
    worker.start()
    time.sleep(3 * chunk)                              # the long prefill is under way
    concurrent = _start(stub, "hi-during", 8)
    worker.join()
    print(f"chunk {chunk * 1e3:.0f} ms, short alone {alone * 1e3:.0f} ms, short during the long prefill "
          f"{concurrent * 1e3:.0f} ms, long prefill {long_done['s']:.1f} s")
    assert concurrent < alone + 2.5 * chunk + 0.5, (concurrent, alone, chunk)
    assert concurrent < long_done["s"] / 3
    for sid in ("hi0", "hi1", "hi-during", "long"):
        stub.EndSession(common_pb2.EndSessionRequest(session_id=sid), timeout=30)


def test_a_cancelled_prefill_frees_the_verifier_within_a_chunk(service):
    target, stub = service
    chunk = _chunk_time(stub)
    with pytest.raises(grpc.RpcError) as err:
        _start(stub, "gives-up", LONG, timeout=4 * chunk)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    t0 = time.perf_counter()
    after = _start(stub, "next", 8)
    waited = time.perf_counter() - t0
    print(f"chunk {chunk * 1e3:.0f} ms; a short request right after the cancelled prefill took {waited * 1e3:.0f} ms")
    assert after < 2.5 * chunk + 0.5
    assert wait_gone(target, "gives-up")
    stub.EndSession(common_pb2.EndSessionRequest(session_id="next"), timeout=30)


def wait_gone(target, sid, timeout=10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if sid not in target.sessions:
            return True
        time.sleep(0.05)
    return False


# prompt tokens of the long request: 4 000 in CI; TANDEM_FAIRNESS_PROMPT_TOKENS=8000 for the figure
WHOLE_LONG = int(os.environ.get("TANDEM_FAIRNESS_PROMPT_TOKENS", "4000"))
SHORT = dict(prompt="Name three colours.", chat=True, max_tokens=16, ignore_eos=True)


def test_short_requests_through_the_gateway_finish_while_a_long_prompt_prefills(default_target, default_drafter):
    """Whole requests, as a client sends them: 3 short chat requests (16 tokens, auto draft length) sent
    while a long prompt prefills each finish within 3x their time alone plus two prefill chunks:
    their rounds interleave with the long prompt's chunks instead of waiting one chunk per round."""
    from harness import Stack
    from tandem.pb import gateway_pb2

    stack = Stack(default_target, default_drafter, draft_length=0)
    try:
        stub = stack.gateway_stub

        def run(**req) -> float:
            t0 = time.perf_counter()
            stub.Generate(gateway_pb2.GenerateRequest(**req), timeout=600)
            return time.perf_counter() - t0

        chunk = min(run(prompt_ids=[(i * 7) % 30000 + 100 for i in range(256)], max_tokens=1) for _ in range(2))
        alone = min(run(**SHORT) for _ in range(3))
        long_ids = [(i * 11) % 30000 + 100 for i in range(WHOLE_LONG)]
        long_done = {}
        worker = threading.Thread(target=lambda: long_done.setdefault("s", run(prompt_ids=long_ids, max_tokens=1)))
        worker.start()
        time.sleep(3 * chunk)                                    # the long prefill is under way
        during = [0.0] * 3

        def short(i):
            during[i] = run(**SHORT)
        shorts = [threading.Thread(target=short, args=(i,)) for i in range(3)]
        for t in shorts:
            t.start()
        for t in shorts:
            t.join()
        still_prefilling = worker.is_alive()
        worker.join()
        print(f"chunk {chunk * 1e3:.0f} ms, short alone {alone * 1e3:.0f} ms, 3 shorts during the long prefill "
              f"{', '.join(f'{d * 1e3:.0f}' for d in during)} ms, long request {long_done['s']:.1f} s")
        assert still_prefilling, "the long prompt finished before the short requests: the test measured nothing"
        # interleaved, a short request waits about one chunk plus its share of three; waiting one chunk per
        # round it would take ~16 chunks (16 tokens), and behind the whole prefill the long request's time.
        # The bound leaves a noisy 2-core host room (4.75 s seen against 3 * 1.04 + 0.92 s on CI)
        for d in during:
            assert d < 3 * alone + 2 * chunk + 0.5, (during, alone, chunk)
    finally:
        stack.close()
