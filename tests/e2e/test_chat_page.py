"""The chat page in headless Chromium against a real gateway (tiny models, real verifier and drafter gRPC
services on loopback, the HTTP API served by uvicorn in the gateway's loop): it streams the answer, marks
each token by origin, shows live statistics, and the speculation switch turns the drafter off."""

import os
import shutil
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from harness import Stack

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
MODEL = "tandem-tiny"
PROMPT = "w1 w5 w9 w20"


@pytest.fixture(scope="module")
def page_url(tiny_target_dir, tiny_drafter_onnx):
    from drafter_service.onnx_drafter import OnnxDrafter
    from gateway.http_api import build_app
    from gateway.http_server import serve_http
    from verifier_service.target import Target

    stack = Stack(Target.load(str(tiny_target_dir)), OnnxDrafter(tiny_drafter_onnx, threads=1), draft_length=3)
    app = build_app(stack.gateway, token=None, model_name=MODEL)
    stack.failed = []               # (path, status) of every request the page made that did not succeed

    async def recording(scope, receive, send):
        async def sending(message):
            if message["type"] == "http.response.start" and message["status"] >= 400:
                stack.failed.append((scope["path"], message["status"]))
            await send(message)
        await app(scope, receive, sending)

    handle = stack.lt.run(serve_http(recording))
    yield handle.url, stack
    stack.lt.run(handle.stop())
    stack.close()


@pytest.fixture(scope="module")
def browser():
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip(f"headless Chromium not installed ({CHROMIUM}, {CHROMEDRIVER}): "
                    "apt-get install chromium chromium-driver")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_AVOID_STATS", "true")
    profile = tempfile.mkdtemp(prefix="tandem-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 "--window-size=1280,900", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def wait_for(driver, script, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for: {script}")


def send(driver, text):
    from selenium.webdriver.common.by import By

    box = driver.find_element(By.ID, "prompt")
    box.clear()
    box.send_keys(text)
    driver.find_element(By.ID, "send").click()
    n = driver.execute_script("return document.querySelectorAll('.msg.assistant').length")
    return n  # index of the new assistant message (1-based count after the click)


def answer(driver, index):
    wait_for(driver, f"const m = document.querySelectorAll('.msg.assistant')[{index}]; "
                     "return m && m.dataset.done === 'true';")
    return driver.execute_script(f"""
        const m = document.querySelectorAll('.msg.assistant')[{index}];
        const toks = [...m.querySelectorAll('.body .tok')].map(s => [s.dataset.origin, s.textContent]);
        return {{text: m.querySelector('.body').textContent, toks: toks,
                meta: (m.querySelector('.meta') || {{}}).textContent || '', error: m.classList.contains('error'),
                tau: document.getElementById('stat-tau').textContent,
                tps: document.getElementById('stat-tps').textContent}};""")


def api_reference(url, speculation, max_tokens=256):
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "temperature": 0,
            "max_tokens": max_tokens, "tandem": {"speculation": speculation}}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()


def test_chat_page_streams_tokens_marked_by_origin(page_url, browser):
    url, stack = page_url
    browser.get(url + "/")
    wait_for(browser, "return document.getElementById('models').textContent.includes('←')")
    assert "tiny_target" in browser.find_element("id", "models").text
    assert browser.execute_script("return document.querySelector('link[rel=icon]').href").endswith("favicon.svg")

    # speculation on: drafted tokens accepted by the target and the target's own tokens, marked apart
    send(browser, PROMPT)
    # streamed: the text grows while the request runs (a streaming cursor is shown), then completes
    first = answer(browser, 0)
    ref = api_reference(url, True)
    assert not first["error"], first
    assert first["text"] == ref["choices"][0]["message"]["content"]
    assert "".join(t for _, t in first["toks"]) == first["text"]
    origins = [o for o, _ in first["toks"]]
    assert set(origins) <= {"draft", "target", "lookup"} and origins[0] == "target"
    if ref["tandem"]["accepted"]:
        assert "draft" in origins
    # another request: with drafting ahead, how many drafted tokens a round finds ready depends on timing, so
    # the same greedy text may come from a few more or fewer accepted drafts
    assert float(first["tau"]) == pytest.approx(ref["tandem"]["acceptance_length"], abs=0.1)
    assert float(first["tps"]) > 0 and "τ" in first["meta"] and "speculative" in first["meta"]

    # speculation off: every token is the target's
    browser.find_element("css selector", "label.switch").click()
    assert browser.execute_script("return document.getElementById('speculation').checked") is False
    send(browser, "w2 w7")
    second = answer(browser, 1)
    assert not second["error"] and second["toks"], second
    assert {o for o, _ in second["toks"]} == {"target"}
    assert "target only" in second["meta"] and second["tau"] == "1.00"

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.find_element("css selector", "label.switch").click()     # back on, for the picture
    assert browser.execute_script("return document.getElementById('speculation').checked") is True
    time.sleep(0.4)                                                   # the switch's transition
    assert browser.save_screenshot(str(ARTIFACTS / "chat_page.png"))
    assert (ARTIFACTS / "chat_page.png").stat().st_size > 10_000
    assert stack.target.sessions.count() == 0 and stack.drafter.session_count() == 0
    assert not stack.failed, stack.failed              # the page asked for nothing missing (no favicon.ico)


def test_stop_button_cancels_the_generation(page_url, browser):
    """Stop aborts the fetch: the gateway sees the disconnect and frees both sessions."""
    url, stack = page_url
    browser.get(url + "/")
    wait_for(browser, "return document.getElementById('models').textContent.includes('←')")
    real = stack.gateway.verifier

    class Slow:
        def __getattr__(self, name):
            return getattr(real, name)

        async def verify(self, *args, **kw):
            import asyncio
            await asyncio.sleep(0.05)
            return await real.verify(*args, **kw)

    stack.gateway.verifier = Slow()
    try:
        browser.execute_script("document.getElementById('max-tokens').value = '200'")   # inside <details>
        send(browser, "w3 w3 w3")
        wait_for(browser, "return document.querySelectorAll('.msg.assistant .tok').length >= 3")
        assert stack.target.sessions.count() == 1
        browser.find_element("id", "stop").click()
        result = answer(browser, 0)
        assert "stopped" in result["meta"]
        end = time.monotonic() + 3
        while time.monotonic() < end and (stack.target.sessions.count() or stack.drafter.session_count()):
            time.sleep(0.05)
        assert stack.target.sessions.count() == 0 and stack.drafter.session_count() == 0
    finally:
        stack.gateway.verifier = real
