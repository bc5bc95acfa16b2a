"""Hostile neighbours, over real gRPC services and the real HTTP server on loopback (tiny models): no request
can freeze the others (big prompts are refused before any work, while a second client keeps being served),
a web page cannot drive the HTTP API (foreign Host and Origin refused, CORS only for allowed origins), slow
or idle connections are dropped, a flood of drafter sessions from one caller does not turn speculation off
for the others, and out-of-range temperatures are refused up front."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
import time

import grpc
import httpx
import pytest

from harness import Stack
from tandem.pb import common_pb2, drafter_grpc, drafter_pb2, gateway_pb2

MODEL = "tandem-neighbours"
POLL_LIMIT_S = 0.2          # what the second client's calls must answer within while a big request is refused


def answered_in_time(times: list[float]) -> bool:
    """Every call within POLL_LIMIT_S, but for one that may miss it by the scheduler's noise on a loaded
    2-core host (and still within a second: a stalled event loop held every call for seconds)."""
    ordered = sorted(times)
    return ordered[-1] < 1.0 and (len(ordered) < 2 or ordered[-2] < POLL_LIMIT_S)


class RecordingTokenizer:
    """The gateway's tokenizer, recording the longest text it was asked to template or tokenize."""

    def __init__(self, inner):
        self.inner, self.longest = inner, 0

    def __call__(self, text, *args, **kw):
        self.longest = max(self.longest, len(text))
        return self.inner(text, *args, **kw)

    def apply_chat_template(self, messages, *args, **kw):
        self.longest = max(self.longest, sum(len(m.get("content", "")) for m in messages))
        return self.inner.apply_chat_template(messages, *args, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def stack(tiny_target_dir, tiny_drafter_onnx):
    from drafter_service.onnx_drafter import OnnxDrafter
    from gateway.http_api import build_app
    from gateway.http_server import serve_http
    from verifier_service.target import Target

    s = Stack(Target.load(str(tiny_target_dir)), OnnxDrafter(tiny_drafter_onnx, threads=1), draft_length=3)
    s.handles = []

    def serve(**kw):
        app_kw = {k: kw.pop(k) for k in ("allowed_hosts", "allowed_origins") if k in kw}
        handle = s.lt.run(serve_http(build_app(s.gateway, token=None, model_name=MODEL, **app_kw), **kw))
        s.handles.append(handle)
        return handle

    s.serve = serve
    s.url = serve().url
    yield s
    for h in s.handles:
        s.lt.run(h.stop())
    s.close()


def chat(prompt="w1 w5 w9", **kw):
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 4,
            **kw}


class Poller(threading.Thread):
    """A second client: GetStatus over gRPC and GET /v1/models over HTTP, back to back, timing each call."""

    def __init__(self, stack):
        super().__init__(daemon=True)
        self.stack, self.stop, self.calls, self.errors = stack, threading.Event(), [], []   # calls: (start, took)

    @property
    def times(self) -> list[float]:
        return [took for _, took in self.calls]

    def run(self):
        with httpx.Client(timeout=30) as http:
            while not self.stop.is_set():
                for call in (lambda: self.stack.gateway_stub.GetStatus(gateway_pb2.GetStatusRequest(), timeout=30),
                             lambda: http.get(f"{self.stack.url}/v1/models").raise_for_status()):
                    t0 = time.perf_counter()
                    try:
                        call()
                    except Exception as exc:        # noqa: BLE001 - reported by the test
                        self.errors.append(repr(exc))
                    self.calls.append((t0, time.perf_counter() - t0))
                time.sleep(0.01)

    def __enter__(self):
        self.start()
        time.sleep(0.3)
        return self

    def __exit__(self, *exc):
        time.sleep(0.3)
        self.stop.set()
        self.join(30)


def _big_text(size: int) -> str:
    unit = "w1 w5 w9 w20 "
    return (unit * (size // len(unit) + 1))[:size]


# The other client, in its own process (its serializing and sending must not compete with the gateway
# for this process's GIL): a big prompt over gRPC, then as an HTTP chat body with a Content-Length, then
# streamed without one. Prints one line per request: what came back.
BIG_CLIENT = textwrap.dedent("""
    import sys, grpc, httpx
    from tandem.pb import gateway_grpc, gateway_pb2
    address, url, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    unit = "w1 w5 w9 w20 "
    text = (unit * (size // len(unit) + 1))[:size]
    body = b'{"model": "x", "messages": [{"role": "user", "content": "' + text.encode() + b'"}]}'
    print("ready", flush=True)
    sys.stdin.readline()
    with grpc.insecure_channel(address) as channel:
        try:
            gateway_grpc.GatewayStub(channel).Generate(gateway_pb2.GenerateRequest(prompt=text, max_tokens=4),
                                                       timeout=60)
            print("grpc OK")
        except grpc.RpcError as err:
            print("grpc", err.code().name)
    try:
        r = httpx.post(url + "/v1/chat/completions", content=body, timeout=60)
        print("http", r.status_code, r.json()["error"]["code"], "--max-request-bytes" in r.json()["error"]["message"])
    except httpx.TransportError:        # the 413 sent and the connection closed while the client still sent:
        print("http closed")            # the kernel may reset it before the client reads the answer
    def chunks():
        for i in range(0, len(body), 1 << 20):
            yield body[i:i + (1 << 20)]
    try:
        print("chunked", httpx.post(url + "/v1/chat/completions", content=chunks(), timeout=60).status_code)
    except httpx.TransportError:        # the server closed the connection while the client still sent
        print("chunked closed")
""")


@pytest.mark.parametrize("mb", [10, 64])
def test_a_big_request_is_refused_before_tokenizing_while_others_are_served(stack, mb):
    """A 10 MB / 64 MB prompt over gRPC, and chat bodies of that size over HTTP (with a Content-Length, and
    streamed without one): each is refused before the tokenizer sees it (413, then the connection closed:
    a client still sending may see the reset instead of the answer), and a second client polling the
    gateway meanwhile gets every answer within 200 ms."""
    client = subprocess.Popen([sys.executable, "-c", BIG_CLIENT, stack.gateway_addr, stack.url, str(mb << 20)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    recorder = stack.gateway.tokenizer = RecordingTokenizer(stack.gateway.tokenizer)
    try:
        assert client.stdout.readline().strip() == "ready"
        with Poller(stack) as poller:
            client.stdin.write("go\n")
            client.stdin.flush()
            out = client.communicate(timeout=300)[0].splitlines()
        assert out[0] == "grpc RESOURCE_EXHAUSTED", out
        assert out[1] in ("http 413 request_too_large True", "http closed"), out
        assert out[2] in ("chunked 413", "chunked closed"), out
        assert not poller.errors, poller.errors[:3]
        assert len(poller.times) >= 10 and answered_in_time(poller.times), sorted(poller.times)[-5:]
        assert recorder.longest < 1 << 20, recorder.longest          # never tokenized
    finally:
        stack.gateway.tokenizer = recorder.inner
        if client.poll() is None:
            client.kill()
    ok = httpx.post(f"{stack.url}/v1/chat/completions", json=chat(), timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 4


def test_a_long_prompt_within_the_limits_is_tokenized_off_the_event_loop(stack):
    """A prompt under --max-request-bytes that takes seconds to tokenize (1 MiB for the tiny word-level
    tokenizer): the second client is answered all along (on the event loop, no call could complete while
    it tokenized); the prompt is then refused by its token count."""
    text = _big_text(1 << 20)
    recorder = stack.gateway.tokenizer = RecordingTokenizer(stack.gateway.tokenizer)
    try:
        with Poller(stack) as poller:
            t0 = time.perf_counter()
            with pytest.raises(grpc.RpcError) as err:
                stack.gateway_stub.Generate(gateway_pb2.GenerateRequest(prompt=text, max_tokens=4), timeout=120)
            t1 = time.perf_counter()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "tokens" in err.value.details()
        assert recorder.longest == len(text)                             # it was tokenized
        during = [d for start, d in poller.calls if t0 < start and start + d < t1]
        assert not poller.errors and len(during) >= 5, (t1 - t0, poller.calls)
    finally:
        stack.gateway.tokenizer = recorder.inner


# ---- web pages -----------------------------------------------------------------------------------
def test_a_web_page_on_another_site_cannot_use_the_api(stack):
    """A cross-origin text/plain POST (a "simple" request: no preflight) and a foreign Host (DNS rebinding)
    are refused before anything runs; the chat page, same-origin calls and clients without Origin work."""
    sessions = stack.target.sessions
    page = "http://evil.example"
    r = httpx.post(f"{stack.url}/v1/completions", content=b'{"prompt": "w1 w2", "max_tokens": 4}', timeout=30,
                   headers={"content-type": "text/plain", "origin": page})
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    assert "--allowed-origins" in r.json()["error"]["message"] and "access-control-allow-origin" not in r.headers
    port = stack.url.rsplit(":", 1)[1]
    for host in (f"evil.example:{port}", "attacker.test", f"rebind.example.com:{port}"):
        r = httpx.post(f"{stack.url}/v1/chat/completions", json=chat(), headers={"host": host}, timeout=30)
        assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed", host
        assert "--allowed-hosts" in r.json()["error"]["message"]
        assert httpx.get(f"{stack.url}/v1/models", headers={"host": host}).status_code == 403
    pre = httpx.options(f"{stack.url}/v1/chat/completions", timeout=30, headers={
        "origin": page, "access-control-request-method": "POST", "access-control-request-headers": "content-type"})
    assert pre.status_code == 403 and "access-control-allow-origin" not in pre.headers
    assert sessions.count() == 0
    # the page and its own calls still work, as do clients that send no Origin
    assert httpx.get(f"{stack.url}/", timeout=30).status_code == 200
    same = httpx.post(f"{stack.url}/v1/chat/completions", json=chat(), timeout=60, headers={"origin": stack.url})
    assert same.status_code == 200 and same.json()["usage"]["completion_tokens"] <= 4
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", socket.gethostname()):
        assert httpx.get(f"{stack.url}/v1/models", headers={"host": host}).status_code == 200, host


def test_allowed_origins_and_hosts(stack):
    """--allowed-origins: preflights are answered and replies carry Access-Control-Allow-Origin for those
    pages only; --allowed-hosts: those names (and a leading-dot domain's names) are answered."""
    handle = stack.serve(allowed_origins=("https://app.example",), allowed_hosts=("gpu-box.lan", ".corp.example"))
    pre = httpx.options(f"{handle.url}/v1/chat/completions", timeout=30, headers={
        "origin": "https://app.example", "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type"})
    assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in pre.headers["access-control-allow-methods"]
    assert "authorization" in pre.headers["access-control-allow-headers"]
    r = httpx.post(f"{handle.url}/v1/chat/completions", json=chat(), timeout=60,
                   headers={"origin": "https://app.example"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
    assert httpx.post(f"{handle.url}/v1/chat/completions", json=chat(), timeout=30,
                      headers={"origin": "https://other.example"}).status_code == 403
    for host, status in (("gpu-box.lan", 200), ("node1.corp.example:8080", 200), ("gpu-box.example", 403)):
        assert httpx.get(f"{handle.url}/v1/models", headers={"host": host}).status_code == status, host
    anyone = stack.serve(allowed_origins=("*",), allowed_hosts=("*",))
    r = httpx.post(f"{anyone.url}/v1/chat/completions", json=chat(), timeout=60,
                   headers={"origin": "https://any.example", "host": "any.example"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://any.example"


# ---- slow and idle connections ---------------------------------------------------------------------
def _closed_within(sock: socket.socket, timeout: float) -> tuple[bool, bytes]:
    """Whether the server closed ``sock`` within ``timeout`` (and what it sent before)."""
    sock.settimeout(timeout)
    got = b""
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True, got
            got += data
    except TimeoutError:
        return False, got
    except ConnectionResetError:
        return True, got


def test_a_trickling_body_and_an_unfinished_head_are_dropped_within_the_read_timeout(stack):
    handle = stack.serve(read_timeout_s=1.0)
    host, port = "127.0.0.1", handle.port
    body_sock = socket.create_connection((host, port))
    body_sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                      b"content-length: 100\r\n\r\n{")
    head_sock = socket.create_connection((host, port))
    head_sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    t0 = time.monotonic()
    trickle = threading.Event()

    def one_byte_a_second():
        while not trickle.wait(0.3):
            try:
                body_sock.send(b" ")
                head_sock.send(b"x")
            except OSError:
                return
    threading.Thread(target=one_byte_a_second, daemon=True).start()
    try:
        closed, got = _closed_within(body_sock, 4.0)
        assert closed and time.monotonic() - t0 < 3.0
        assert got.startswith(b"HTTP/1.1 408") and b"--http-read-timeout" in got
        closed, _ = _closed_within(head_sock, 3.0)
        assert closed and time.monotonic() - t0 < 3.5
    finally:
        trickle.set()
        body_sock.close()
        head_sock.close()
    # a normal request on the same server is unaffected (its head and body arrive at once)
    r = httpx.post(f"{handle.url}/v1/chat/completions", json=chat(), timeout=60)
    assert r.status_code == 200


def test_open_connections_are_bounded(stack):
    """Past --http-max-connections a new connection is closed as it is accepted; the held ones are dropped
    after the read timeout, and the server then answers again."""
    handle = stack.serve(read_timeout_s=1.5, max_connections=8)
    held = [socket.create_connection(("127.0.0.1", handle.port)) for _ in range(8)]
    try:
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", handle.port))
        closed, _ = _closed_within(extra, 1.0)
        assert closed, "a connection past the bound stayed open"
        extra.close()
        assert all(_closed_within(s, 3.0)[0] for s in held), "idle connections outlived the read timeout"
    finally:
        for s in held:
            s.close()
    time.sleep(0.1)
    assert httpx.get(f"{handle.url}/v1/models", timeout=30).status_code == 200


# ---- sampling bounds -----------------------------------------------------------------------------------
def test_tiny_temperatures_are_refused_up_front(stack):
    """1e-38 would overflow float32 logits / temperature: INVALID_ARGUMENT naming temperature on the gateway,
    the verifier and the drafter (each validates SamplingParams), and the services stay up."""
    tiny = common_pb2.SamplingParams(temperature=1e-38)
    with pytest.raises(grpc.RpcError) as err:
        stack.gateway_stub.Generate(gateway_pb2.GenerateRequest(prompt="w1 w2", max_tokens=4, sampling=tiny),
                                    timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "temperature" in err.value.details()
    from tandem.pb import verifier_pb2
    with pytest.raises(grpc.RpcError) as err:
        stack.verifier_stub.StartSession(verifier_pb2.StartSessionRequest(session_id="t", prompt_ids=[1, 5],
                                                                          sampling=tiny), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "temperature" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        stack.drafter_stub.Propose(drafter_pb2.ProposeRequest(session_id="t", appended_tokens=[1, 5], k=2,
                                                              sampling=tiny), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "temperature" in err.value.details()
    ok = stack.gateway_stub.Generate(gateway_pb2.GenerateRequest(
        prompt="w1 w2", max_tokens=4, sampling=common_pb2.SamplingParams(temperature=1e-4, seed=3, has_seed=True)),
        timeout=30)
    assert len(ok.token_ids) >= 1


# ---- drafter sessions --------------------------------------------------------------------------------------
def test_a_flood_of_drafter_sessions_from_one_caller_does_not_turn_speculation_off(stack):
    """One caller keeps opening drafter sessions (more than the drafter holds, each used once, none idle
    for the 5 s after which a session may be pushed out): the gateway's requests meanwhile all speculate,
    and the drafter stays up for everyone."""
    drafter = stack.drafter
    stop, opened = threading.Event(), [0]

    def flood():
        with grpc.insecure_channel(stack.drafter_addr) as channel:
            stub = drafter_grpc.DrafterStub(channel)
            while not stop.is_set():
                try:
                    stub.Propose(drafter_pb2.ProposeRequest(session_id=f"flood{opened[0]}", appended_tokens=[1, 5, 9],
                                                            k=1, session_token="flood"), timeout=30)
                except grpc.RpcError as err:     # no room: the flood's own longest-idle sessions are young
                    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                opened[0] += 1

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    try:
        deadline = time.monotonic() + 60
        while drafter.session_count() < drafter.sessions.max_sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        assert drafter.session_count() == drafter.sessions.max_sessions, "the flood did not fill the drafter"
        for i in range(4):
            reply = stack.gateway_stub.Generate(gateway_pb2.GenerateRequest(
                prompt=f"w{i + 1} w5 w9", max_tokens=12, ignore_eos=True, draft_length=3), timeout=60)
            s = reply.stats
            assert s.speculative and s.proposed > 0 and not s.fallback_reason, s.fallback_reason
        assert stack.gateway.drafter_healthy
    finally:
        stop.set()
        flooder.join(30)
        for sid in [f"flood{i}" for i in range(opened[0] + 1)]:
            drafter.end_session(sid)


def test_a_session_the_drafter_has_no_room_for_costs_that_request_only(stack):
    """Two other callers hold the drafter's only two sessions (neither more than half): the gateway's
    request is refused a session (RESOURCE_EXHAUSTED) and finishes with the target alone, naming why, but
    the drafter is not marked down: the next request speculates."""
    drafter = stack.drafter
    saved = drafter.sessions.max_sessions
    drafter.sessions.max_sessions = 2
    # two connections (two callers): channels of one process would otherwise share one
    channels = [grpc.insecure_channel(stack.drafter_addr, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(2)]
    try:
        for i, ch in enumerate(channels):
            drafter_grpc.DrafterStub(ch).Propose(drafter_pb2.ProposeRequest(
                session_id=f"other{i}", appended_tokens=[1, 5, 9], k=1, session_token="o"), timeout=30)
        req = gateway_pb2.GenerateRequest(prompt="w2 w5 w9", max_tokens=12, ignore_eos=True, draft_length=3)
        refused = stack.gateway_stub.Generate(req, timeout=60)
        assert "RESOURCE_EXHAUSTED" in refused.stats.fallback_reason and len(refused.token_ids) == 12
        assert stack.gateway.drafter_healthy, stack.gateway.drafter_down_reason
        for i in range(2):
            drafter.end_session(f"other{i}")
        again = stack.gateway_stub.Generate(req, timeout=60)
        assert again.stats.speculative and again.stats.proposed > 0 and not again.stats.fallback_reason
        assert list(again.token_ids) == list(refused.token_ids)
    finally:
        drafter.sessions.max_sessions = saved
        for ch in channels:
            ch.close()
