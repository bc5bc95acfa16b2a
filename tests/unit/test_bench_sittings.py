"""The bench's other sittings (``--versus``, ``--two-machine``, ``--concurrency``) and their parts: the
streaming client against a stand-in llama-server over real HTTP, finding llama.cpp's tools, the
llama-bench report, the delay relay on real sockets, and the figures and reports of each sitting from
samples whose answers are worked out by hand."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import llama_stand_ins
import pytest

from tandem.bench import figures as F
from tandem.bench.http_stream import chat_body, decode_figures, percentile, stream_chat
from tandem.bench.workload import Prompt


@pytest.fixture()
def stand_in_bin(tmp_path) -> Path:
    return llama_stand_ins.install(tmp_path / "bin")


@pytest.fixture()
def stand_in_server(stand_in_bin, tmp_path):
    from tandem.bench.llama_server import LlamaServer

    with LlamaServer(stand_in_bin / "llama-server", tmp_path / "model.gguf", 1, log_path=tmp_path / "s.log",
                     startup_timeout_s=60) as server:
        yield server


def test_stream_chat_counts_tokens_and_times_the_decode(stand_in_server):
    """A held-back token (llama-server sends an incomplete character with the next one) still counts:
    the usage's total is the truth; decode tok/s leaves the first token's wait out."""
    s = stream_chat(stand_in_server.url, chat_body("hi", 12), timeout_s=30)
    assert "error" not in s, s
    assert s["new_tokens"] == 12 and sum(s["chunk_tokens"]) == 12 and len(s["chunk_tokens"]) == 11
    assert s["usage"]["completion_tokens"] == 12 and s["finish_reason"] == "length"
    assert s["text"].split() == llama_stand_ins.WORDS[:12]
    f = decode_figures(s)
    step_ms = llama_stand_ins.STEP_S * 1e3
    assert s["ttft_ms"] >= 2 * step_ms                             # the "prefill" and the first token
    assert f["decode_tps"] <= 1e3 / step_ms * 1.05                  # never faster than the server's pace
    assert f["decode_tps"] > 1e3 / step_ms / 4                      # nor far slower on a busy host
    assert len(f["itl_ms"]) == 11 and min(f["itl_ms"]) > 0
    assert f["request_tps"] < f["decode_tps"]                       # the request's rate includes the prefill


def test_stream_chat_reports_http_errors(stand_in_server):
    s = stream_chat(stand_in_server.url + "/nope", chat_body("hi", 2), timeout_s=10)
    assert s["error"].startswith("HTTP 404")
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    assert "error" in stream_chat(f"http://127.0.0.1:{port}", chat_body("hi", 2), timeout_s=5)


def test_find_tools_order_and_the_build_hint(stand_in_bin, tmp_path, monkeypatch):
    from tandem.bench import llama_tools as T

    monkeypatch.setenv("PATH", "/nonexistent")
    empty_cache = tmp_path / "cache"
    assert T.find_tools(None, cache=empty_cache) is None
    assert "python -m tandem.bench.llama_tools build" in T.missing_message()
    with pytest.raises(FileNotFoundError, match="llama_tools build"):
        T.find_tools(str(tmp_path))                                  # an explicit folder without them
    found = T.find_tools(str(stand_in_bin))
    assert found.origin == "--llama-bin-dir" and found.server == stand_in_bin / "llama-server"
    for version in ("9.0.0", "10.0.0"):                              # the newest build in the cache wins
        llama_stand_ins.install(empty_cache / version / "bin")
    assert T.find_tools(None, cache=empty_cache).bench == empty_cache / "10.0.0" / "bin" / "llama-bench"
    monkeypatch.setenv("PATH", str(stand_in_bin))
    assert T.find_tools(None, cache=tmp_path / "none").origin == "PATH"
    # a forced-ISA build goes beside the cache, never where find_tools looks: --llama-bin-dir picks it
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert T.cache_root("avx2") == tmp_path / "xdg" / "tandem" / "llama.cpp-avx2"
    assert T.cache_root() == tmp_path / "xdg" / "tandem" / "llama.cpp"
    with pytest.raises(ValueError, match="isa 'sse'"):
        T.build(isa="sse")


def test_llama_bench_decode_row(stand_in_bin, tmp_path):
    from tandem.bench.llama_server import llama_bench, parse_llama_bench

    b = llama_bench(stand_in_bin / "llama-bench", tmp_path / "m.gguf", threads=1, n_gen=64)
    assert b["tokens_per_s"] == llama_stand_ins.BENCH_TPS and b["n_gen"] == 64 and b["n_threads"] == 1
    assert b["command"][-8:] == ["-n", "64", "-p", "0", "-r", "3", "-o", "json"]
    rows = '[{"n_prompt": 512, "n_gen": 0, "avg_ts": 900}, {"n_prompt": 0, "n_gen": 128, "avg_ts": 40}]'
    assert parse_llama_bench("warming up\n" + rows)["tokens_per_s"] == 40
    assert "error" in parse_llama_bench("no json here")


def _echo_server():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve():
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return srv


@pytest.mark.parametrize("delay_ms", [0.0, 40.0])
def test_delay_relay_adds_the_round_trip_and_keeps_order(tmp_path, delay_ms):
    from tandem.bench.two_machine import start_relay

    echo = _echo_server()
    proc, port = start_relay(f"127.0.0.1:{echo.getsockname()[1]}", delay_ms, None, tmp_path)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            rtts = []
            for i in range(3):
                msg = f"ping {i};".encode()
                t0 = time.perf_counter()
                c.sendall(msg)
                got = b""
                while len(got) < len(msg):
                    got += c.recv(100)
                rtts.append((time.perf_counter() - t0) * 1e3)
                assert got == msg
    finally:
        proc.terminate()
        proc.wait(5)
        echo.close()
    assert min(rtts) >= delay_ms * 0.95                     # half the round trip each way
    if delay_ms:
        assert min(rtts) < delay_ms + 200


def test_netns_relay_script_still_runs(tmp_path):
    """tests/e2e/netns_relay.py (run as a script inside a network namespace) is the same relay."""
    echo = _echo_server()
    (tmp_path / "d").write_text("0")
    script = Path(__file__).resolve().parents[1] / "e2e" / "netns_relay.py"
    proc = subprocess.Popen([sys.executable, str(script), "--listen", "127.0.0.1", "--port-file",
                             str(tmp_path / "p"), "--to", f"127.0.0.1:{echo.getsockname()[1]}", "--delay-file",
                             str(tmp_path / "d")])
    try:
        for _ in range(300):
            if (tmp_path / "p").exists() and (tmp_path / "p").read_text():
                break
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", int((tmp_path / "p").read_text())), timeout=10) as c:
            c.sendall(b"x")
            assert c.recv(10) == b"x"
    finally:
        proc.terminate()
        proc.wait(5)
        echo.close()


# ---- the figures of each sitting, from samples worked out by hand ----------------------------------
def _sample(mode, q, chunk_ms, chunk_tokens, repeat=0, text="t", **kw):
    s = {"mode": mode, "question_id": q, "category": "c", "repeat": repeat, "chunk_ms": chunk_ms,
         "chunk_tokens": chunk_tokens, "new_tokens": sum(chunk_tokens), "ttft_ms": chunk_ms[0],
         "wall_ms": chunk_ms[-1], "text": text, **kw}
    return F.with_figures(s)


def test_decode_figures_spread_a_chunk_over_its_tokens():
    f = decode_figures({"chunk_ms": [100.0, 110.0, 150.0], "chunk_tokens": [1, 1, 4], "new_tokens": 6,
                        "wall_ms": 200.0, "ttft_ms": 100.0})
    assert f["decode_tps"] == pytest.approx(5 / 0.050)
    assert f["itl_ms"] == pytest.approx([10.0, 10.0, 10.0, 10.0, 10.0])
    assert f["request_tps"] == pytest.approx(30.0)
    assert percentile([1, 2, 3, 4, 5], 50) == 3 and percentile([0, 10], 95) == pytest.approx(9.5)
    assert percentile([], 50) is None


def test_versus_ratios_targets_and_agreement():
    from tandem.bench import versus as V

    # decode: llama-server 10 tok/s (10 tokens after the first in 1 s), Tandem plain 15, auto 30
    def chunks(rate):
        return [100.0 + i * 1e3 / rate for i in range(11)], [1] * 11

    samples = []
    for q in (1, 2):
        samples.append(_sample(V.LLAMA_SERVER, q, *chunks(10), text="hello world" if q == 1 else "abcd"))
        for m, rate in ((V.HTTP_PLAIN, 15), (V.GRPC_PLAIN, 15), (V.HTTP_AUTO, 30), (V.GRPC_AUTO, 30)):
            samples.append(_sample(m, q, *chunks(rate), text="hello world" if q == 1 else "abXY"))
    samples[-1]["text"] = "different"                              # grpc auto differs on q2: a Tandem bug
    results = {"samples": samples, "llama_bench": [{"tokens_per_s": 12.0}, {"tokens_per_s": 14.0},
                                                   {"error": "x"}, {"tokens_per_s": 13.0}]}
    a = V.analyze_versus(results)
    assert a["llama_bench_decode_tps"] == 13.0 and a["llama_bench_runs"] == [12.0, 14.0, 13.0]
    plain = a["modes"][V.GRPC_PLAIN]
    assert plain["decode_tps"] == pytest.approx(15) and plain["vs_llama_server_decode"] == pytest.approx(1.5)
    assert plain["vs_llama_bench"] == pytest.approx(15 / 13)
    assert a["modes"][V.HTTP_AUTO]["vs_llama_bench"] == pytest.approx(30 / 13)
    assert a["targets"][V.GRPC_PLAIN]["met"] is False             # 1.15x llama-bench < 1.2x
    g = a["agreement"][V.LLAMA_SERVER]
    assert (g["prompts"], g["identical"]) == (2, 1) and g["common_prefix_share"] == pytest.approx((1 + 0.5) / 2)
    assert a["mismatches"] == [V.GRPC_AUTO]
    results.update(analysis=a, environment={"cpu": "Test CPU 9000"}, gguf="/x/m.gguf", threads=1,
                   llama_server={"command": ["llama-server", "-m", "m.gguf"]}, tandem={"command": "tandem up"})
    md = V.markdown_versus(results)
    assert "Test CPU 9000" in md and "1.50x" in md and "**not met**" in md and "a mismatch is a bug" in md
    assert V.bench_points(10, 3) == [0, 5, 10] and V.bench_points(10, 1) == [0] and V.bench_points(4, 0) == []


def test_versus_pairs_each_prompt_with_the_llama_bench_runs_around_it():
    """The host doubled its speed after the first prompt: against the median of all llama-bench runs, Tandem's
    first prompt reads slow; against the runs around each prompt, each reads as what it was."""
    from tandem.bench import versus as V

    runs = [{"tokens_per_s": 10.0, "at_step": 0}, {"tokens_per_s": 20.0, "at_step": 1}, {"tokens_per_s": 20.0, "at_step": 2},
            {"error": "x", "at_step": 2}]
    samples = [{"mode": V.GRPC_PLAIN, "question_id": 1, "step": 0, "decode_tps": 15.0},
               {"mode": V.GRPC_PLAIN, "question_id": 2, "step": 1, "decode_tps": 22.0},
               {"mode": V.HTTP_PLAIN, "question_id": 2, "step": 1, "error": "timeout"}]
    assert V.paired_with_llama_bench(samples, runs, V.GRPC_PLAIN) == pytest.approx([15 / 15, 22 / 20])
    assert V.paired_with_llama_bench(samples, runs, V.HTTP_PLAIN) == []
    assert V.paired_with_llama_bench(samples, [], V.GRPC_PLAIN) == []
    old = [dict(x) for x in samples[:2]]                           # written before the step was recorded
    for x in old:
        del x["step"]
    assert V.paired_with_llama_bench([old[0]] + [{}] * (len(V.MODES) - 1) + [old[1]], runs, V.GRPC_PLAIN) == \
        pytest.approx([1.0, 1.1])


def test_two_machine_hit_rate_and_tokens_by_origin():
    from tandem.bench import two_machine as T

    def rounds(sources, accepted, emitted):
        n = len(sources)
        return {"k": [3] * n, "accepted": accepted, "emitted": emitted, "source": sources, "draft_ms": [1.0] * n,
                "verify_ms": [5.0] * n, "overhead_ms": [0.5] * n, "round_ms": [7.0] * n}

    auto = T.auto_name(20)
    samples = [
        _sample(T.PLAIN, 1, [100.0, 300.0], [1, 4], token_ids=[1, 2, 3, 4, 5],
                rounds=rounds(["", "", "", ""], [0, 0, 0, 0], [1, 1, 1, 1])),
        _sample(T.LOOKUP_ONLY, 1, [100.0, 200.0], [1, 4], token_ids=[1, 2, 3, 4, 5],
                rounds=rounds(["copy", "", ""], [2, 0, 0], [3, 1, 1])),
        _sample(auto, 1, [100.0, 150.0], [1, 4], token_ids=[1, 2, 3, 4, 9],
                rounds=rounds(["ahead", "wait", "ahead", "propose", "copy"], [1, 0, 2, 0, 1], [2, 1, 3, 1, 2])),
    ]
    results = {"samples": samples, "modes": [T.PLAIN, T.LOOKUP_ONLY, auto]}
    a = T.analyze_two_machine(results)
    src = a["modes"][auto]["sources"]
    assert src["drafted_rounds"] == 4 and src["hit_rate"] == pytest.approx(0.5)
    assert src["accepted_by_source"] == {"ahead": 3, "wait": 0, "propose": 0, "copy": 1}
    assert src["target_tokens"] == 5
    assert a["modes"][T.LOOKUP_ONLY]["sources"]["hit_rate"] is None
    assert a["modes"][auto]["request_tps_vs_plain"] == pytest.approx(2.0)       # 5 tokens in 150 ms vs 300 ms
    assert a["modes"][auto]["request_tps_vs_lookup_only"] == pytest.approx(200 / 150)
    assert a["modes"][auto]["per_round"]["tokens_per_round"] == pytest.approx(9 / 5)
    assert a["mismatches"] == [{"mode": auto, "question_id": 1, "repeat": 0}]
    results.update(analysis=a, environment={"cpu": "Test CPU"}, verifier_cpus="0", drafter_cpus="1",
                   delays_ms=[20.0], relay="relay")
    md = T.markdown_two_machine(results)
    assert "50%" in md and "draft 3, lookup 1, target 5" in md and "GREEDY MISMATCH" in md and "Test CPU" in md


def test_two_machine_report_says_where_the_time_goes():
    """The first token's share, a plain round's verify in each mode (the drafter's work slowing the shared
    host's forward shows as a slower plain round than the baseline's) and the plain rounds after a rejection."""
    from tandem.bench import two_machine as T

    def rounds(sources, proposed, accepted, verify):
        n = len(sources)
        return {"k": proposed, "proposed": proposed, "accepted": accepted, "emitted": [a + 1 for a in accepted],
                "source": sources, "draft_ms": [0.0] * n, "verify_ms": verify, "overhead_ms": [0.5] * n,
                "round_ms": [v + 2 for v in verify], "gateway_ms": [0.25] * n, "wire_ms": [1.5] * n}

    auto = T.auto_name(0)
    samples = [
        _sample(T.PLAIN, 1, [100.0, 400.0], [1, 4], rounds=rounds(["", "", "", ""], [0] * 4, [0] * 4, [8.0] * 4)),
        _sample(T.LOOKUP_ONLY, 1, [100.0, 400.0], [1, 4], rounds=rounds(["", ""], [0, 0], [0, 0], [8.0, 8.0])),
        # a rejected block, two plain rounds, a kept block, a rejected one at the end
        _sample(auto, 1, [100.0, 200.0], [1, 4],
                rounds=rounds(["ahead", "", "", "ahead", "ahead"], [4, 0, 0, 2, 3], [1, 0, 0, 2, 0],
                              [20.0, 9.0, 10.0, 15.0, 18.0])),
    ]
    results = {"samples": samples, "modes": [T.PLAIN, T.LOOKUP_ONLY, auto]}
    a = T.analyze_two_machine(results)
    t = a["modes"][auto]["time_split"]
    assert t["first_token_share"] == pytest.approx(0.5)
    assert t["plain_verify_ms"] == pytest.approx(9.5) and a["modes"][T.PLAIN]["time_split"]["plain_verify_ms"] == 8.0
    assert t["rejections"] == 2 and t["plain_rounds_after_rejection"] == pytest.approx(1.0)
    assert (t["gateway_ms_per_round"], t["wire_ms_per_round"]) == (0.25, 1.5)
    results.update(analysis=a, environment={"cpu": "Test CPU"}, verifier_cpus="0", drafter_cpus="1",
                   delays_ms=[0.0], relay="relay")
    md = T.markdown_two_machine(results)
    assert "Where the time goes" in md and "| 9.50 |" in md and "1.00 (2)" in md and "| 25% |" in md
    assert "called over gRPC by every gateway" in md            # results from before the local verifier
    results["verifier"] = "local"
    assert "in each gateway's process (as `tandem up` runs it)" in T.markdown_two_machine(results)


def test_concurrency_runs_clients_at_once_and_reports_percentiles():
    from tandem.bench import concurrency as C

    order = [Prompt(i, "c", f"p{i}") for i in range(3)]
    seqs = C.client_sequences(order, 4, 2)
    assert [[p.question_id for p in s] for s in seqs] == [[0, 1], [1, 2], [2, 0], [0, 1]]
    # every level of a sitting sends the same requests: one client all eight, two clients four each
    ids = lambda seqs: [[p.question_id for p in s] for s in seqs]          # noqa: E731
    assert ids(C.client_sequences(order, 1, 2, most=4)) == [[0, 1, 2, 0, 1, 2, 0, 1]]
    assert ids(C.client_sequences(order, 2, 2, most=4)) == [[0, 2, 1, 0], [1, 0, 2, 1]]
    assert sorted(sum(ids(C.client_sequences(order, 3, 2, most=4)), [])) == sorted(sum(ids(seqs), []))
    inside = [0]
    most = [0]
    lock = threading.Lock()

    def send(prompt):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        t0 = time.perf_counter()
        time.sleep(0.05)
        with lock:
            inside[0] -= 1
        dt = (time.perf_counter() - t0) * 1e3
        return {"new_tokens": 5, "chunk_ms": [dt / 5 * i for i in range(1, 6)], "chunk_tokens": [1] * 5,
                "ttft_ms": dt / 5, "wall_ms": dt}

    samples = C.run_level(send, seqs, 4, C.PLAIN)
    assert len(samples) == 8 and most[0] == 4                     # all four clients in flight together
    f = C.level_figures(samples)
    assert f["tokens"] == 40 and f["errors"] == 0
    assert f["wall_s"] < 8 * 0.05                                   # concurrent, not one after another
    assert f["aggregate_tps"] == pytest.approx(40 / f["wall_s"])
    assert f["itl_p50_ms"] <= f["itl_p95_ms"] and f["itl_p50_ms"] >= 0.05 * 1e3 / 5 * 0.9
    results = {"samples": samples + [dict(s, mode=C.LLAMA) for s in samples], "levels": [4]}
    a = C.analyze_concurrency(results)
    assert a["levels"]["4"][C.PLAIN]["vs_llama_server"] == pytest.approx(1.0)
    results.update(analysis=a, environment={"cpu": "Test CPU"}, requests_per_client=2, threads=1,
                   tandem={"command": "tandem up"}, llama_server={"4": {"command": ["llama-server", "--parallel", "4"]}})
    md = C.markdown_concurrency(results)
    assert "--parallel 4" in md and "Test CPU" in md


def test_concurrency_counts_the_window_with_every_client_in_flight():
    """The figure at N sessions: tokens that arrived while every client had a request open, over that window.
    Client 1 starts late and client 0 stops early here: the start and the tail are left out, tokens outside
    are not counted, and each system is set against its own single client."""
    from tandem.bench import concurrency as C

    def sample(client, start, end, arrivals, mode=C.PLAIN, level=2):
        ms = [(t - start) * 1e3 for t in arrivals]
        return {"mode": mode, "level": level, "client": client, "start_s": start, "end_s": end, "new_tokens": 2 * len(ms),
                "chunk_ms": ms, "chunk_tokens": [2] * len(ms), "ttft_ms": ms[0], "wall_ms": (end - start) * 1e3}

    two = [sample(0, 0.0, 1.0, [0.2, 0.4, 0.6, 0.8, 1.0]), sample(1, 0.5, 2.0, [0.6, 1.0, 1.5, 2.0]),
           sample(0, 1.0, 1.6, [1.2, 1.4, 1.55])]
    assert C.all_in_flight(two) == (0.5, 1.6)                # client 1's first send .. client 0's last reply
    f = C.level_figures(two)
    inside = [0.6, 0.8, 1.0, 0.6, 1.0, 1.5, 1.2, 1.4, 1.55]  # arrivals in [0.5, 1.6]: 9 chunks of 2 tokens
    assert f["steady_s"] == pytest.approx(1.1) and f["steady_tps"] == pytest.approx(2 * len(inside) / 1.1)
    assert f["aggregate_tps"] == pytest.approx(24 / 2.0)
    # gaps inside: 0.2 s thrice (client 0's first request), 0.4 and 0.5 (client 1), 0.2 and 0.15 (client 0's
    # second request), each spread over its chunk's 2 tokens; a request's first chunk has no gap
    assert f["steady_itl_p95_ms"] == pytest.approx(C.percentile([100.0] * 8 + [75.0] * 2 + [200.0] * 2 + [250.0] * 2, 95))
    assert C.all_in_flight([sample(0, 0.0, 1.0, [1.0]), sample(1, 1.0, 2.0, [2.0])]) is None   # never both
    alone = [sample(0, 0.0, 1.0, [0.5, 1.0], level=1)]
    a = C.analyze_concurrency({"samples": two + alone, "levels": [1, 2]})
    assert a["levels"]["2"][C.PLAIN]["steady_vs_one_client"] == pytest.approx(f["steady_tps"] / 4.0)
    assert a["levels"]["2"][C.PLAIN]["vs_one_client"] == pytest.approx(12.0 / 4.0)
    results = {"samples": two + alone, "levels": [1, 2], "analysis": a, "environment": {"cpu": "Test CPU"},
               "requests_per_client": 2, "threads": 1, "tandem": {"command": "tandem up"}}
    md = C.markdown_concurrency(results)
    assert "all in flight tok/s" in md and f"{f['steady_tps']:.2f}" in md


def test_concurrency_rounds_pair_each_level_with_its_own_round():
    """Run again later in the sitting, a level's tok/s is the median of its rounds, and its ratio to one client
    the median of each round's own ratio: here the host ran twice as fast in round 1, which a ratio of the
    medians would mix into the batching figure."""
    from tandem.bench import concurrency as C

    def run(level, rnd, tokens_per_s):
        # `level` clients, each one request of 10 tokens over 1 s / speed: all in flight throughout
        speed = tokens_per_s / (10 * level)
        return [{"mode": C.PLAIN, "level": level, "client": c, "round": rnd, "start_s": 0.0, "end_s": 1.0 / speed,
                 "new_tokens": 10, "chunk_ms": [i * 100.0 / speed for i in range(1, 11)], "chunk_tokens": [1] * 10,
                 "ttft_ms": 100.0 / speed, "wall_ms": 1e3 / speed} for c in range(level)]

    samples = run(1, 0, 100.0) + run(4, 0, 250.0) + run(1, 1, 200.0) + run(4, 1, 500.0) + run(1, 2, 100.0) + run(4, 2, 240.0)
    a = C.analyze_concurrency({"samples": samples, "levels": [1, 4]})
    four = a["levels"]["4"][C.PLAIN]
    assert four["aggregate_tps"] == pytest.approx(250.0)                   # the median of 250, 500, 240
    assert four["vs_one_client"] == pytest.approx(2.5)                     # of 2.5, 2.5, 2.4
    assert four["steady_vs_one_client"] == pytest.approx(2.5)
    assert [round(f["aggregate_tps"]) for f in four["per_round"].values()] == [250, 500, 240]
    results = {"samples": samples, "levels": [1, 4], "analysis": a, "environment": {"cpu": "Test CPU"}, "rounds": 3,
               "requests_per_client": 1, "threads": 1, "tandem": {"command": "tandem up"}}
    md = C.markdown_concurrency(results)
    assert "ran 3 times over" in md and "250, 500, 240" in md and "2.50x, 2.50x, 2.40x" in md


def test_concurrency_report_checks_every_output_against_plain_at_the_fewest_clients():
    """A batched session's greedy text must be the one it gets alone: the report counts the requests checked
    and names any that differ (here auto at 4 clients on question 2)."""
    from tandem.bench import concurrency as C

    def sample(mode, level, q, text):
        return {"mode": mode, "level": level, "question_id": q, "text": text}

    samples = [sample(C.PLAIN, 1, 1, "a"), sample(C.PLAIN, 4, 1, "a"), sample(C.AUTO, 4, 1, "a"),
               sample(C.PLAIN, 4, 2, "b"), sample(C.AUTO, 4, 2, "c"), sample(C.LLAMA, 4, 2, "zz"),
               dict(sample(C.AUTO, 4, 1, ""), error="timeout")]
    same = C.same_outputs(samples)
    assert same == {"requests": 5, "prompts": 2, "differ": [(C.AUTO, 4, 2)], "alone": 1}
    results = {"samples": samples, "levels": [1, 4], "analysis": {"levels": {}, "outputs": same},
               "environment": {"cpu": "Test CPU"}, "requests_per_client": 1, "threads": 1,
               "tandem": {"command": "tandem up"}}
    md = C.markdown_concurrency(results)
    assert "**1 differ**: tandem-auto at 4 clients, question 2" in md


def test_one_sitting_at_a_time_and_flag_checks(tmp_path):
    import argparse

    from tandem.bench import cli

    p = argparse.ArgumentParser()
    cli.configure(p)
    args = p.parse_args(["--versus", "--concurrency", "1,2"])
    with pytest.raises(ValueError, match="one sitting at a time"):
        cli.run(args)
    args = p.parse_args(["--two-machine", "--delays", "5,x", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="--delays"):
        cli.run(args)
    args = p.parse_args(["--two-machine", "--two-machine-variants", "no-ahead,later", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="--two-machine-variants: unknown later"):
        cli.run(args)
    args = p.parse_args(["--concurrency", "1,4", "--concurrency-rounds", "0", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="--concurrency-rounds must be >= 1"):
        cli.run(args)
    assert cli.sitting_of(p.parse_args([])) is None


# ---- the sittings end to end on tiny models: real services as processes ---------------------------
QUESTIONS = [{"question_id": 1, "category": "alpha", "turns": ["w1 w5 w9 w20 w1 w5 w9"]},
             {"question_id": 2, "category": "beta", "turns": ["w3 w4 w7 w3 w4"]}]


def _bench_args(*argv):
    import argparse

    from tandem.bench import cli

    p = argparse.ArgumentParser()
    cli.configure(p)
    return cli, p.parse_args([*argv, "--no-progress", "--repeats", "1", "--max-tokens", "12",
                              "--verifier-threads", "1", "--startup-timeout", "300"])


@pytest.fixture()
def questions_file(tmp_path):
    import json

    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_getaffinity")
                    or not {0, 1} <= __import__("os").sched_getaffinity(0), reason="needs CPUs 0 and 1")
def test_two_machine_sitting_on_tiny_models(tmp_path, questions_file, tiny_target_dir, tiny_target_export):
    """The drafter is the tiny target itself (every draft accepted), so auto drafts through the relay at
    0 ms; the gateways at 30 ms talk to the drafter through their own relay; the lookup-only gateway
    never calls a drafter; every output equals plain decoding. A second drafter node (the model-free
    ``suffix``) runs beside the first, behind relays of its own. (At 30 ms auto may rightly stop drafting
    for so fast a target: the relay's delay itself is tested on sockets above.)"""
    import json

    from tandem.bench import two_machine as T

    out = tmp_path / "out"
    cli, args = _bench_args("--two-machine", "--delays", "0,30", "--target", str(tiny_target_dir), "--drafter",
                            str(tiny_target_export[0]), "--questions", str(questions_file), "--split", "all",
                            "--drafter-nodes", f"{tiny_target_export[0]};suffix", "--two-machine-k", "2",
                            "--out", str(out))
    assert cli.run(args) == 0
    r = json.loads((out / "results.json").read_text())
    a = r["analysis"]
    assert r["modes"] == ["plain", "lookup-only", "auto@0ms", "no-ahead@0ms", "suffix:auto@0ms", "auto@30ms",
                          "no-ahead@30ms", "suffix:auto@30ms", "k=2@0ms", "k=2@30ms"]
    for d in (0, 30):            # pinned k: the first node's gateway and drafter draft (at 30 ms too)
        assert a["modes"][f"k=2@{d}ms"]["sources"]["drafted_rounds"] > 0
    assert not a["mismatches"] and not a["errors"]
    lookup = a["modes"][T.LOOKUP_ONLY]["sources"]
    assert lookup["drafted_rounds"] == 0 and set(lookup["rounds"]) <= {"plain", "copy"}
    assert set(a["modes"][T.PLAIN]["sources"]["rounds"]) == {"plain"}
    drafter = lambda m: r["gateway_commands"][m][r["gateway_commands"][m].index("--drafter") + 1]
    auto = [m for m in r["modes"] if "@" in m and not m.startswith("k=")]
    assert len({drafter(m) for m in auto}) == len(auto) == 6      # a drafter (and its relay) per auto mode
    assert a["modes"]["no-ahead@0ms"]["sources"]["rounds"].get("ahead", 0) == 0
    drafter_name = r["models"]["drafter"]["model_name"]
    for s in r["samples"]:                     # every speculative gateway reached the drafter through its relay
        if s["mode"].startswith("suffix:"):
            assert s["server"]["draft_model"] == "suffix" and s["server"]["speculative"]
        elif "@" in s["mode"]:
            assert s["server"]["draft_model"] == drafter_name and s["server"]["speculative"]
        elif s["mode"] == T.LOOKUP_ONLY:
            assert s["server"]["draft_model"] != drafter_name
    md = (out / "report.md").read_text()
    assert "hit rate" in md and "lookup-only" in md and r["environment"]["cpu"] in md


def test_versus_sitting_with_stand_in_llama_tools(tmp_path, questions_file, tiny_target_dir, tiny_target_export,
                                                  stand_in_bin, monkeypatch):
    """tandem up really started (HTTP and gRPC); llama-server and llama-bench are the stand-ins (the
    real ones need a GGUF and a build): every mode answers every prompt, Tandem's four modes agree,
    and the report gives each Tandem figure against llama-bench's (the stand-in's 50 tok/s) and where auto's
    tokens came from."""
    import json

    from tandem.bench import llama_peer
    from tandem.bench import versus as V

    monkeypatch.setattr(llama_peer, "gguf_path", lambda target: (tmp_path / "model.gguf", ""))
    out = tmp_path / "out"
    cli, args = _bench_args("--versus", "--target", str(tiny_target_dir), "--drafter", str(tiny_target_export[0]),
                            "--questions", str(questions_file), "--split", "all", "--llama-bin-dir",
                            str(stand_in_bin), "--llama-bench-runs", "2", "--out", str(out))
    args.repeats = 2                                        # the second repeat would find its prompt cached
    assert cli.run(args) == 0
    r = json.loads((out / "results.json").read_text())
    a = r["analysis"]
    assert [b["at_step"] for b in r["llama_bench"]] == [0, 4]
    llama = [s for s in r["samples"] if s["mode"] == V.LLAMA_SERVER]
    assert llama and all(s["timings"]["cache_n"] == 0 for s in llama)      # no prefill from the prompt cache
    assert a["llama_bench_decode_tps"] == llama_stand_ins.BENCH_TPS
    assert set(a["modes"]) == set(V.MODES) and not a["errors"] and not a["mismatches"]
    for m in V.MODES:
        assert a["modes"][m]["prompts"] == 2 and len([s for s in r["samples"] if s["mode"] == m]) == 4
        assert a["modes"][m]["vs_llama_bench"] == pytest.approx(a["modes"][m]["decode_tps"] / 50.0)
    # where auto's tokens came from is reported over HTTP, every token counted once (whether auto drafts
    # on this pair is a timing choice: the benchmarks show it, a test on a shared host cannot)
    http_auto = [s for s in r["samples"] if s["mode"] == V.HTTP_AUTO]
    assert sum(a["modes"][V.HTTP_AUTO]["origins"].values()) == sum(s["new_tokens"] for s in http_auto)
    assert set(a["modes"][V.HTTP_AUTO]["origins"]) <= {"target", "draft", "lookup"}
    assert a["modes"][V.GRPC_AUTO]["rounds"]["tokens_per_round"] >= 1
    md = (out / "report.md").read_text()
    assert "vs llama-bench decode" in md and r["environment"]["cpu"] in md and "llama-server" in md


def test_concurrency_runs_llama_server_unless_told_not_to(tmp_path, stand_in_bin, monkeypatch):
    """llama-server runs beside Tandem where llama.cpp is built and the target is a GGUF file; --no-llama
    (the flag that skips the in-process llama.cpp peers) leaves it out too, and the report says why."""
    from tandem.bench import concurrency as C
    from tandem.bench import llama_peer

    monkeypatch.setattr(llama_peer, "gguf_path", lambda target: (tmp_path / "model.gguf", ""))
    common = ("--concurrency", "1,2", "--llama-bin-dir", str(stand_in_bin), "--out", str(tmp_path / "out"))
    tools, gguf, note = C.llama_server_plan(_bench_args(*common)[1])
    assert tools is not None and gguf == tmp_path / "model.gguf" and note == ""
    assert C.llama_server_plan(_bench_args(*common, "--no-llama")[1]) == (None, None,
                                                                          "llama-server not run (--no-llama)")
    monkeypatch.setattr(llama_peer, "gguf_path", lambda target: (None, "the target is not a GGUF file"))
    assert C.llama_server_plan(_bench_args(*common)[1])[2] == "llama-server not run: the target is not a GGUF file"


def test_concurrency_runs_auto_unless_told_not_to():
    """--no-auto (the flag that skips the auto mode of the other sittings) leaves auto out of the levels too."""
    from tandem.bench import concurrency as C

    assert C.tandem_modes(_bench_args("--concurrency", "1,2")[1]) == [C.PLAIN, C.AUTO]
    assert C.tandem_modes(_bench_args("--concurrency", "1,2", "--no-auto")[1]) == [C.PLAIN]


def test_concurrency_sitting_with_a_stand_in_llama_server(tmp_path, questions_file, tiny_target_dir,
                                                           tiny_target_export, stand_in_bin, monkeypatch):
    """Two levels, twice over, against tandem up (plain and auto over HTTP) and the stand-in llama-server
    started with --parallel N per level and round: every client's every request answered, figures at each
    level from both rounds."""
    import json

    from tandem.bench import concurrency as C
    from tandem.bench import llama_peer

    monkeypatch.setattr(llama_peer, "gguf_path", lambda target: (tmp_path / "model.gguf", ""))
    out = tmp_path / "out"
    cli, args = _bench_args("--concurrency", "1,2", "--concurrency-requests", "2", "--concurrency-rounds", "2",
                            "--target", str(tiny_target_dir),
                            "--drafter", str(tiny_target_export[0]), "--questions", str(questions_file), "--split",
                            "all", "--llama-bin-dir", str(stand_in_bin), "--out", str(out))
    assert cli.run(args) == 0
    r = json.loads((out / "results.json").read_text())
    levels = r["analysis"]["levels"]
    for level in ("1", "2"):
        assert set(levels[level]) == {C.LLAMA, C.PLAIN, C.AUTO}
        for f in levels[level].values():
            assert f["requests"] == 2 * 2 * 2 and f["errors"] == 0 and f["tokens"] > 0   # the same requests at each level
            assert f["itl_p50_ms"] <= f["itl_p95_ms"] and set(f["per_round"]) == {"0", "1"}
    assert levels["2"][C.LLAMA]["tokens"] == 12 * 2 * 2                 # a round's: the stand-in answers 12 tokens
    assert [s["round"] for s in r["samples"] if s["level"] == 1 and s["mode"] == C.PLAIN] == [0] * 4 + [1] * 4
    assert (sorted(s["question_id"] for s in r["samples"] if s["level"] == 1 and s["mode"] == C.PLAIN)
            == sorted(s["question_id"] for s in r["samples"] if s["level"] == 2 and s["mode"] == C.PLAIN))
    cmd = r["llama_server"]["2"]["command"]
    assert cmd[cmd.index("--parallel") + 1] == "2" and cmd[cmd.index("-c") + 1] == str(2 * 4096)
    assert sorted({s["client"] for s in r["samples"] if s["level"] == 2}) == [0, 1]
    assert "--parallel 2" in (out / "report.md").read_text()
    # the verifier's batching at each level, from its Prometheus counters (the tiny target's forward is too
    # short for 2 clients to meet in one reliably: only the bounds are certain)
    for level in ("1", "2"):
        for system in (C.PLAIN, C.AUTO):
            f = levels[level][system]
            assert 1.0 <= f["sessions_per_forward"] <= int(level) and f["rows_per_forward"] >= f["sessions_per_forward"]
            assert f["queue_ms"] >= 0
    assert "sessions a forward" in (out / "report.md").read_text()
