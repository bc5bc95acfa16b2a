"""The OpenAI-compatible HTTP API over real verifier/drafter gRPC services on loopback, with tiny models,
called with the real ``openai`` client (and httpx for the raw error shapes and the disconnect)."""

import asyncio
import json
import re
import threading
import time

import grpc
import httpx
import pytest

from harness import Stack
from tandem.pb import gateway_pb2

openai = pytest.importorskip("openai")
MODEL = "tandem-test"
ERROR_KEYS = {"message", "type", "param", "code"}


class SlowVerifier:
    """The gateway's real verifier client, with an optional pause before each Verify (disconnect tests).
    ``pausing`` is set during a pause; ``lose_cancels``: that many cancellations during a pause are lost as
    Python 3.11's ``asyncio.wait_for`` loses one when its result arrives in the same loop turn (the
    CancelledError swallowed, the task's request not taken back)."""

    def __init__(self, inner):
        self.inner, self.delay, self.lose_cancels = inner, 0.0, 0
        self.pausing = threading.Event()

    async def start(self, *args, **kw):
        return await self.inner.start(*args, **kw)

    async def verify(self, *args, **kw):
        if self.delay:
            self.pausing.set()
            try:
                await asyncio.sleep(self.delay)
            except asyncio.CancelledError:
                if not self.lose_cancels:
                    raise
                self.lose_cancels -= 1
            finally:
                self.pausing.clear()
        return await self.inner.verify(*args, **kw)

    async def end(self, *args, **kw):
        await self.inner.end(*args, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class HttpStack:
    def __init__(self, target, drafter, token=None):

        self.stack = Stack(target, drafter, draft_length=3)
        self.gateway = self.stack.gateway
        self.slow = self.gateway.verifier = SlowVerifier(self.gateway.verifier)
        self.handles = []
        self.url = self.serve(token)

    def serve(self, token):
        from gateway.http_api import build_app
        from gateway.http_server import serve_http

        handle = self.stack.lt.run(serve_http(build_app(self.gateway, token=token, model_name=MODEL)))
        self.handles.append(handle)
        return handle.url

    def close(self):
        for h in self.handles:
            self.stack.lt.run(h.stop())
        self.stack.close()


def load_pair(tiny_target_dir, tiny_drafter_onnx):
    from drafter_service.onnx_drafter import OnnxDrafter
    from verifier_service.target import Target

    return Target.load(str(tiny_target_dir)), OnnxDrafter(tiny_drafter_onnx, threads=1)


@pytest.fixture(scope="module")
def hs(tiny_target_dir, tiny_drafter_onnx):
    s = HttpStack(*load_pair(tiny_target_dir, tiny_drafter_onnx))
    yield s
    s.close()


@pytest.fixture
def client(hs):
    return openai.OpenAI(base_url=f"{hs.url}/v1", api_key="unused", max_retries=0, timeout=60)


def grpc_generate(hs, **kw):
    kw.setdefault("max_tokens", 16)
    return hs.stack.gateway_stub.Generate(gateway_pb2.GenerateRequest(**kw), timeout=60)


def chat_body(prompt="w1 w5 w9", **kw):
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "temperature": 0, **kw}


def sse_events(response):
    """The JSON payloads of an SSE response, and whether it ended with [DONE]."""
    events, done = [], False
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
            continue
        events.append(json.loads(data))
    return events, done


def wait_until(cond, timeout, step=0.02):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return cond()


def assert_error(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param, body
    if code is not None:
        assert body["error"]["code"] == code, body
    return body["error"]


# ---- happy paths ---------------------------------------------------------------------------------
def test_models_and_health(hs, client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    for name in (MODEL, "tandem", "default", hs.gateway.target.model_name):    # models.retrieve
        assert client.models.retrieve(name).id == MODEL
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-4o")
    assert err.value.body["code"] == "model_not_found" and MODEL in err.value.body["message"]
    r = httpx.get(f"{hs.url}/health")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["drafter"] == "up"


def test_the_chat_page_links_only_what_exists(hs):
    """Everything the page loads is served (its icon too: no 404 for /favicon.ico in the browser's console)."""
    page = httpx.get(f"{hs.url}/", timeout=30).text
    links = re.findall(r'(?:href|src)="(/[^"]*)"', page)
    assert "/static/favicon.svg" in links
    for link in [*links, "/favicon.ico"]:
        assert httpx.get(f"{hs.url}{link}", timeout=30).status_code == 200, link


@pytest.mark.parametrize("prompt", ["w1 w5 w9 w20", "w3 w4"])
def test_chat_greedy_equals_grpc_and_usage_counts_tokens(hs, client, prompt):
    ref = grpc_generate(hs, prompt=prompt, chat=True, max_tokens=20)
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                           temperature=0, max_tokens=20)
    assert reply.choices[0].message.content == ref.text
    assert reply.choices[0].finish_reason == ref.finish_reason
    assert reply.usage.completion_tokens == len(ref.token_ids)
    assert reply.usage.prompt_tokens == ref.stats.prompt_tokens
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    # the prompt is the target's chat template, tokenized without special tokens
    tok = hs.gateway.tokenizer
    rendered = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                       tokenize=False)
    assert reply.usage.prompt_tokens == len(tok(rendered, add_special_tokens=False)["input_ids"])
    t = reply.tandem
    assert t["speculative"] and t["rounds"] == ref.stats.rounds and t["accepted"] == ref.stats.accepted
    assert t["proposed"] == ref.stats.proposed and t["acceptance_length"] == pytest.approx(
        ref.stats.mean_acceptance_length, abs=1e-3)
    assert t["draft_model"] and t["verify_ms"] > 0

    streamed = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                              temperature=0, max_tokens=20, stream=True,
                                              stream_options={"include_usage": True})
    chunks = list(streamed)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.text
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == ref.finish_reason
    assert finish[0].tandem["rounds"] == ref.stats.rounds            # the stats in the last chunk too
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == len(ref.token_ids)
    assert last.usage.prompt_tokens == ref.stats.prompt_tokens and last.tandem["accepted"] == ref.stats.accepted


def test_completion_greedy_equals_grpc_streamed_and_not(hs, client):
    prompt = "w7 w8 w2 w30"
    ref = grpc_generate(hs, prompt=prompt, max_tokens=12)
    reply = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=12)
    assert reply.object == "text_completion"
    assert reply.choices[0].text == ref.text and reply.choices[0].finish_reason == ref.finish_reason
    assert reply.usage.completion_tokens == len(ref.token_ids) and reply.usage.prompt_tokens == ref.stats.prompt_tokens
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=12, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ref.text
    assert chunks[-1].usage.completion_tokens == len(ref.token_ids)
    # token ids as the prompt
    ids = hs.gateway.tokenizer(prompt)["input_ids"]
    by_ids = client.completions.create(model=MODEL, prompt=ids, temperature=0, max_tokens=12)
    assert by_ids.choices[0].text == ref.text


def test_streamed_tokens_carry_their_origin(hs):
    body = chat_body("w1 w5 w9 w20", max_tokens=30, ignore_eos=True, stream=True)
    with httpx.stream("POST", f"{hs.url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events, done = sse_events(r)
    assert done
    tokens, text = [], ""
    for e in events[1:-1]:
        piece = e["choices"][0]["delta"]["content"]
        assert "".join(t["text"] for t in e["tandem"]["tokens"]) == piece      # marks add up to the text
        assert e["tandem"]["acceptance_length"] >= 1.0 and e["tandem"]["tokens_per_second"] > 0
        tokens += e["tandem"]["tokens"]
        text += piece
    final = events[-1]["tandem"]
    origins = [t["origin"] for t in tokens]
    assert set(origins) <= {"draft", "target", "lookup"}
    assert len(tokens) == final["new_tokens"] == 30
    assert origins.count("draft") == final["accepted"] > 0           # accepted drafts ...
    assert origins.count("target") == final["rounds"] + 1            # ... and one target token per round + prefill
    assert origins[0] == "target"


def test_speculation_switch(hs, client):
    prompt = [{"role": "user", "content": "w2 w9 w11"}]
    on = client.chat.completions.create(model=MODEL, messages=prompt, temperature=0, max_tokens=16)
    off = client.chat.completions.create(model=MODEL, messages=prompt, temperature=0, max_tokens=16,
                                         extra_body={"tandem": {"speculation": False}})
    off2 = client.chat.completions.create(model=MODEL, messages=prompt, temperature=0, max_tokens=16,
                                          extra_body={"no_speculation": True})
    assert on.tandem["speculative"] and on.tandem["proposed"] > 0
    for o in (off, off2):
        assert not o.tandem["speculative"] and o.tandem["proposed"] == 0 and o.tandem["acceptance_length"] == 1.0
        assert o.choices[0].message.content == on.choices[0].message.content


def test_sampling_parameters_and_seed(hs, client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "w4 w5"}], temperature=0.9, top_p=0.9, seed=11,
              max_tokens=16, extra_body={"top_k": 20})
    a, b = client.chat.completions.create(**kw), client.chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    ref = grpc_generate(hs, prompt="w4 w5", chat=True, max_tokens=16, sampling={
        "temperature": 0.9, "top_p": 0.9, "top_k": 20, "seed": 11, "has_seed": True})
    assert a.choices[0].message.content == ref.text


def test_stop_cuts_exactly_also_when_streaming(hs, client):
    prompt = "w1 w5 w9 w20"
    full = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                          temperature=0, max_tokens=24, extra_body={"ignore_eos": True})
    text = full.choices[0].message.content
    words = text.split(" ")
    assert len(words) >= 10
    # a stop string across a token boundary, starting inside a word
    stop = words[6][1:] + " " + words[7]
    expected = text[:text.index(stop)]
    stops = [stop, "never-generated"]
    cut = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}], temperature=0,
                                         max_tokens=24, stop=stops, extra_body={"ignore_eos": True})
    assert cut.choices[0].message.content == expected and cut.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                                 temperature=0, max_tokens=24, stop=stops, stream=True,
                                                 extra_body={"ignore_eos": True}))
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(pieces) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"
    # a single-string stop on completions, cut exactly too
    comp = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=24, stop=words[3],
                                     extra_body={"ignore_eos": True})
    ref = grpc_generate(hs, prompt=prompt, max_tokens=24, ignore_eos=True).text
    assert comp.choices[0].text == ref[:ref.index(words[3])] and comp.choices[0].finish_reason == "stop"
    assert wait_until(lambda: hs.stack.target.sessions.count() == 0 and hs.stack.drafter.session_count() == 0, 2)


def test_eight_parallel_streams(hs):
    prompts = [f"w{i} w{i + 3} w{i + 7}" for i in range(3, 11)]
    refs = [grpc_generate(hs, prompt=p, chat=True, max_tokens=24, ignore_eos=True).text for p in prompts]

    async def one(client, prompt):
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=24, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        parts, usage = [], None
        async for c in stream:
            if c.choices:
                parts.append(c.choices[0].delta.content or "")
            if c.usage:
                usage = c.usage
        return "".join(parts), usage

    async def main():
        async with openai.AsyncOpenAI(base_url=f"{hs.url}/v1", api_key="x", max_retries=0, timeout=60) as client:
            return await asyncio.gather(*(one(client, p) for p in prompts))

    results = asyncio.run(main())
    assert [r[0] for r in results] == refs
    assert all(r[1].completion_tokens == 24 for r in results)
    assert wait_until(lambda: hs.stack.target.sessions.count() == 0 and hs.stack.drafter.session_count() == 0, 2)


def assert_freed_soon(hs, closed: float) -> None:
    """Both sessions and the request's slot freed within 8 s of ``closed`` (room for a loaded CI host), and
    every cancel the slow verifier was to lose lost (the case the test meant to run)."""
    target, drafter = hs.stack.target, hs.stack.drafter
    assert wait_until(lambda: target.sessions.count() == 0 and drafter.session_count() == 0
                      and hs.gateway.active_requests == 0, 8.0)
    assert time.monotonic() - closed < 8.0
    assert hs.slow.lose_cancels == 0


@pytest.mark.parametrize("lost", [0, 1], ids=["cancelled", "cancel-lost"])
def test_disconnect_mid_stream_frees_both_sessions(hs, lost):
    """The client leaves mid-stream: both sessions and the request's slot are freed within a round or so,
    also when the cancellation is lost on its way (the generation then stops at its next round)."""
    target, drafter = hs.stack.target, hs.stack.drafter
    hs.slow.delay = 0.5 if lost else 0.1        # ~200 rounds: 20 s or more if nobody stopped it
    try:
        body = chat_body("w1 w2 w3", max_tokens=200, ignore_eos=True, stream=True)
        with httpx.stream("POST", f"{hs.url}/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            lines = r.iter_lines()      # kept: dropping it mid-stream would close the connection there and then
            seen = 0
            while seen < 4:
                seen += next(lines).startswith("data: {")
            assert wait_until(lambda: target.sessions.count() == 1 and drafter.session_count() == 1, 5.0)
            assert hs.gateway.active_requests == 1
            if lost:            # leave while a round pauses, so that the cancellation lands there and is lost
                hs.slow.lose_cancels = lost
                assert hs.slow.pausing.wait(5.0)
        closed = time.monotonic()       # leaving the block closed the connection
        assert_freed_soon(hs, closed)
    finally:
        hs.slow.delay, hs.slow.lose_cancels = 0.0, 0
    ok = httpx.post(f"{hs.url}/v1/chat/completions", json=chat_body(max_tokens=4), timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 4


def test_a_cancelled_grpc_generate_frees_both_sessions_though_the_cancel_is_lost(hs):
    """A gRPC client cancels its unary Generate while a round is in flight and the cancellation is lost
    there: the request still stops at the next round and both sessions are freed."""
    target, drafter = hs.stack.target, hs.stack.drafter
    hs.slow.delay = 0.5                 # ~200 rounds: 100 s if nobody stopped it
    try:
        future = hs.stack.gateway_stub.Generate.future(gateway_pb2.GenerateRequest(
            prompt="w1 w2 w3", max_tokens=200, ignore_eos=True), timeout=120)
        assert wait_until(lambda: target.sessions.count() == 1 and drafter.session_count() == 1, 10.0)
        hs.slow.lose_cancels = 1
        assert hs.slow.pausing.wait(5.0)
        future.cancel()
        closed = time.monotonic()
        assert_freed_soon(hs, closed)
    finally:
        hs.slow.delay, hs.slow.lose_cancels = 0.0, 0


# ---- errors --------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra, param, code", [
    ({"frobnicate": 1}, "frobnicate", "unknown_parameter"),
    ({"n": 2}, "n", "unsupported_value"),
    ({"temperature": -1}, "temperature", None),
    ({"temperature": 2.5}, "temperature", None),
    ({"temperature": "hot"}, "temperature", "invalid_type"),
    ({"top_p": 0}, "top_p", None),
    ({"max_tokens": 0}, "max_tokens", None),
    ({"max_tokens": 100_000}, "max_tokens", "invalid_value"),      # the engine's ValueError
    ({"stop": 5}, "stop", "invalid_type"),
    ({"logprobs": True}, "logprobs", "unsupported_value"),
    ({"tandem": {"speculate": False}}, "tandem.speculate", "unknown_parameter"),
    ({"messages": []}, "messages", None),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", None),
])
def test_bad_requests_are_400_in_openai_shape(hs, extra, param, code):
    r = httpx.post(f"{hs.url}/v1/chat/completions", json={**chat_body(), **extra}, timeout=30)
    err = assert_error(r, 400, param, code)
    assert err["type"] == "invalid_request_error"


def test_bad_completion_requests_and_client_errors(hs, client):
    assert_error(httpx.post(f"{hs.url}/v1/completions", json={"model": MODEL, "prompt": "w1", "n": 3}), 400, "n")
    assert_error(httpx.post(f"{hs.url}/v1/completions", json={"model": MODEL, "prompt": [1, 999], "max_tokens": 3},
                            timeout=30), 400)                                 # the verifier's INVALID_ARGUMENT
    assert_error(httpx.post(f"{hs.url}/v1/completions", content=b"{not json", timeout=30), 400,
                 code="invalid_json")
    # JSON's \ud800 escape decodes to a lone surrogate, which no tokenizer takes: a 400 naming the field
    lone = b'{"model": "m", "max_tokens": 3, "prompt": "w1 \\ud800"}'
    assert "unpaired UTF-16 surrogate" in assert_error(httpx.post(f"{hs.url}/v1/completions", content=lone, timeout=30),
                                                        400, "prompt")["message"]
    lone = b'{"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "w1"}], "stop": ["\\udfff"]}'
    assert_error(httpx.post(f"{hs.url}/v1/chat/completions", content=lone, timeout=30), 400, "stop[0]")
    pair = b'{"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "w1 \\ud83d\\ude00"}]}'
    assert httpx.post(f"{hs.url}/v1/chat/completions", content=pair, timeout=30).status_code == 200
    deep = b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"   # beyond the JSON parser's stack
    assert_error(httpx.post(f"{hs.url}/v1/chat/completions", content=deep, timeout=30), 400, code="invalid_json")
    deep = b'{"model": "m", "messages": ' + b"[" * 900 + b"]" * 900 + b"}"           # within it: walked, refused
    assert_error(httpx.post(f"{hs.url}/v1/chat/completions", content=deep, timeout=30), 400, "messages[0]")
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "w1"}], n=2)
    assert err.value.status_code == 400
    # the gateway stays up
    assert httpx.post(f"{hs.url}/v1/chat/completions", json=chat_body(max_tokens=3)).status_code == 200


def test_any_model_name_is_served(hs, client):
    """One model is served: the served name, "tandem" (the README's) and any other name get it, as with
    llama-server; replies and /v1/models name the served model."""
    for name in (MODEL, "tandem", "gpt-4o", hs.gateway.target.model_name):
        reply = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "w1 w2"}],
                                               temperature=0, max_tokens=3)
        assert reply.model == MODEL and reply.usage.completion_tokens <= 3
    assert_error(httpx.post(f"{hs.url}/v1/chat/completions", json={**chat_body(), "model": 7}), 400, "model")


@pytest.mark.parametrize("extra, param", [
    ({"seed": -1}, "seed"),
    ({"seed": 2**64}, "seed"),
    ({"temperature": 1e-38}, "temperature"),             # float32 logits / 1e-38 overflow: refused up front
    ({"top_k": 2**40}, "top_k"),
    ({"tandem": {"draft_length": 999}}, "tandem.draft_length"),     # the engine's InvalidInput, by its param
])
def test_range_errors_name_their_param(hs, extra, param):
    err = assert_error(httpx.post(f"{hs.url}/v1/chat/completions", json={**chat_body(max_tokens=3), **extra},
                                  timeout=30), 400, param)
    assert err["type"] == "invalid_request_error"


def test_a_prompt_over_max_prompt_tokens_names_the_prompt(hs):
    saved = hs.gateway.config.max_prompt_tokens
    hs.gateway.config.max_prompt_tokens = 8
    try:
        long = " ".join(f"w{i % 60}" for i in range(40))
        err = assert_error(httpx.post(f"{hs.url}/v1/chat/completions", json=chat_body(long, max_tokens=3),
                                      timeout=30), 400, "messages")
        assert "--max-prompt-tokens" in err["message"]
        assert_error(httpx.post(f"{hs.url}/v1/completions", json={"prompt": long, "max_tokens": 3}, timeout=30),
                     400, "prompt")
        grpc_err = pytest.raises(grpc.RpcError, grpc_generate, hs, prompt=long).value
        assert grpc_err.code() == grpc.StatusCode.INVALID_ARGUMENT and "--max-prompt-tokens" in grpc_err.details()
    finally:
        hs.gateway.config.max_prompt_tokens = saved


def test_a_bug_is_500_or_internal_with_a_request_id_and_no_exception_text(hs, caplog):
    """An unexpected exception reaches the client as 500 / INTERNAL with a request id to quote; its text (which
    may hold internals) only goes to the log, under that id."""
    real = hs.slow.inner

    class Broken:
        def __getattr__(self, name):
            return getattr(real, name)

        async def start(self, *args, **kw):
            raise RuntimeError("secret internal detail")

    hs.slow.inner = Broken()
    try:
        with caplog.at_level("ERROR"):
            for stream in (False, True):
                err = assert_error(httpx.post(f"{hs.url}/v1/chat/completions", json=chat_body(stream=stream),
                                              timeout=30), 500, code="internal_error")
                assert "request id" in err["message"] and "secret" not in err["message"]
            rpc = pytest.raises(grpc.RpcError, grpc_generate, hs, prompt="w1 w2").value
        assert rpc.code() == grpc.StatusCode.INTERNAL and "request id" in rpc.details()
        assert "secret" not in rpc.details()
        request_id = rpc.details().split("request id ")[1].split(";")[0]
        logged = [r for r in caplog.records if request_id in r.getMessage()]
        assert logged and "secret internal detail" in str(logged[0].exc_info[1])
    finally:
        hs.slow.inner = real
    assert httpx.post(f"{hs.url}/v1/chat/completions", json=chat_body(max_tokens=3), timeout=30).status_code == 200


def test_bearer_token_is_required_when_configured(hs):
    url = hs.serve("s3cret")
    body = chat_body(max_tokens=3)
    err = assert_error(httpx.post(f"{url}/v1/chat/completions", json=body), 401, code="invalid_api_key")
    assert "token" in err["message"]
    assert_error(httpx.post(f"{url}/v1/chat/completions", json=body, headers={"authorization": "Bearer nope"}), 401)
    assert_error(httpx.get(f"{url}/v1/models"), 401)
    assert httpx.get(f"{url}/health").status_code == 200                 # open, like the gRPC health checks
    assert httpx.get(f"{url}/").status_code == 200                       # the page itself holds no secret
    good = openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret", max_retries=0)
    assert good.chat.completions.create(**{k: v for k, v in body.items()}).usage.completion_tokens <= 3
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()


def test_over_max_concurrent_requests_is_429(hs):
    gw, lt = hs.gateway, hs.stack.lt
    state = {}

    async def hold():
        state["release"] = asyncio.Event()
        async with gw.admit():
            state["held"] = True
            await state["release"].wait()

    saved = gw.config.max_concurrent_requests
    gw.config.max_concurrent_requests = 1
    fut = asyncio.run_coroutine_threadsafe(hold(), lt.loop)
    try:
        assert wait_until(lambda: state.get("held"), 5)
        for stream in (False, True):
            r = httpx.post(f"{hs.url}/v1/chat/completions", json=chat_body(max_tokens=3, stream=stream), timeout=30)
            err = assert_error(r, 429, code="rate_limit_exceeded")
            assert "max-concurrent-requests" in err["message"]
        with pytest.raises(openai.RateLimitError):
            openai.OpenAI(base_url=f"{hs.url}/v1", api_key="x", max_retries=0).completions.create(
                model=MODEL, prompt="w1", max_tokens=2)
    finally:
        lt.loop.call_soon_threadsafe(state["release"].set)
        fut.result(5)
        gw.config.max_concurrent_requests = saved
    assert httpx.post(f"{hs.url}/v1/chat/completions", json=chat_body(max_tokens=3), timeout=30).status_code == 200


def test_verifier_down_is_503(tiny_target_dir, tiny_drafter_onnx):
    s = HttpStack(*load_pair(tiny_target_dir, tiny_drafter_onnx))
    try:
        assert httpx.get(f"{s.url}/health").status_code == 200
        s.stack.lt.run(s.stack.verifier_service.stop(0))
        s.stack.verifier_service = None
        for path, body in (("/v1/chat/completions", chat_body(max_tokens=3)),
                           ("/v1/chat/completions", chat_body(max_tokens=3, stream=True)),
                           ("/v1/completions", {"model": MODEL, "prompt": "w1 w2", "max_tokens": 3})):
            err = assert_error(httpx.post(f"{s.url}{path}", json=body, timeout=30), 503)
            assert "verifier" in err["message"] and err["type"] == "server_error"
        health = httpx.get(f"{s.url}/health", timeout=10)
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        with pytest.raises(openai.APIStatusError) as exc:
            openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "w1"}], max_tokens=2)
        assert exc.value.status_code == 503
        assert s.gateway.active_requests == 0
    finally:
        s.close()
