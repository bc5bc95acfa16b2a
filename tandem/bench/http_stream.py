"""One streamed OpenAI ``/v1/chat/completions`` request, timed chunk by chunk, and the figures of a
streamed reply: the same client for ``tandem up``'s HTTP API and for ``llama-server``.

Per request (``decode_figures``; the same for gRPC samples that carry ``chunk_ms``/``chunk_tokens``):

* TTFT: from sending the request to the first chunk that carries a token;
* request tokens/s: new tokens / the request's wall time (prefill included);
* decode tokens/s: the tokens after the first chunk / the time from the first chunk to the last one
  (the prefill left out, as ``llama-bench -p 0 -n N`` leaves it out);
* inter-token latency: each chunk's gap to the chunk before, spread evenly over its tokens (a
  speculative round streams several tokens in one chunk: each gets its share of the gap).

Token counts: Tandem's chunks list their tokens (``tandem.tokens``, with each token's origin:
draft, lookup or target); llama-server streams one token per chunk and reports ``usage`` (asked for
with ``stream_options.include_usage``) and its own ``timings``.
"""

from __future__ import annotations

import http.client
import json
import time
from urllib.parse import urlsplit


def one_off() -> dict:
    """A request's own ``cache_salt``: Tandem's prefix cache (verifier_service.prefix_cache) shares nothing with
    it, so each mode prefills each prompt whole, as for a prompt never sent before, however the modes of a
    sitting are interleaved on the same prompts."""
    import uuid

    return {"cache_salt": "bench-" + uuid.uuid4().hex}


def chat_body(text: str, max_tokens: int, *, model: str = "default", temperature: float = 0.0,
              ignore_eos: bool = False, extra: dict | None = None) -> dict:
    """The request both servers get: one user turn, greedy by default, streamed, usage at the end."""
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": temperature, "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    body.update(extra or {})
    return body


def _events(resp):
    """The ``data:`` payloads of a server-sent event stream, as they arrive."""
    buf = b""
    while True:
        line = resp.readline()
        if not line:
            return
        line = line.rstrip(b"\r\n")
        if line.startswith(b"data:"):
            buf += line[5:].strip()
        elif not line and buf:
            yield buf.decode()
            buf = b""


def stream_chat(base_url: str, body: dict, timeout_s: float = 600.0, token: str | None = None) -> dict:
    """POSTs ``body`` to ``base_url``/v1/chat/completions and reads the stream. Returns a sample:
    wall_ms, ttft_ms, new_tokens, text, chunk_ms (arrival of each token-bearing chunk, from the
    send), chunk_tokens (tokens in it), origins (Tandem: counts per origin), usage/timings/tandem
    (what the server said at the end); ``error`` instead when the request failed."""
    u = urlsplit(base_url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout_s)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    sample: dict = {}
    chunk_ms: list[float] = []
    chunk_tokens: list[int] = []
    origins: dict[str, int] = {}
    text: list[str] = []
    t0 = time.perf_counter()
    try:
        conn.request("POST", u.path.rstrip("/") + "/v1/chat/completions", body=json.dumps(body), headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            sample["error"] = f"HTTP {resp.status}: {resp.read()[:300].decode(errors='replace')}"
            return sample
        for data in _events(resp):
            if data == "[DONE]":
                break
            now = (time.perf_counter() - t0) * 1e3
            obj = json.loads(data)
            if "error" in obj and not obj.get("choices"):
                sample["error"] = f"stream error: {json.dumps(obj['error'])[:300]}"
                return sample
            for key in ("usage", "timings"):
                if obj.get(key):
                    sample[key] = obj[key]
            if obj.get("tandem") and "tokens" not in obj["tandem"]:     # the closing chunk's statistics
                sample["tandem"] = obj["tandem"]
            choice = (obj.get("choices") or [{}])[0]
            piece = (choice.get("delta") or {}).get("content") or ""
            tokens = (obj.get("tandem") or {}).get("tokens")
            n = len(tokens) if tokens is not None else (1 if piece else 0)
            for t in tokens or ():
                origins[t.get("origin", "?")] = origins.get(t.get("origin", "?"), 0) + 1
            if n:
                chunk_ms.append(now)
                chunk_tokens.append(n)
                text.append(piece)
            if choice.get("finish_reason"):
                sample["finish_reason"] = choice["finish_reason"]
    except (OSError, http.client.HTTPException, ValueError) as exc:
        sample["error"] = f"{type(exc).__name__}: {exc}"
        return sample
    finally:
        conn.close()
    wall = (time.perf_counter() - t0) * 1e3
    streamed = sum(chunk_tokens)
    reported = (sample.get("usage") or {}).get("completion_tokens")
    if reported is not None and reported != streamed and chunk_tokens:
        # llama-server holds back a token's bytes (an incomplete character, a possible stop string) and
        # sends them with the next one: the last chunk takes the difference, the usage's count is the truth
        chunk_tokens[-1] += reported - streamed
    sample.update(wall_ms=wall, ttft_ms=chunk_ms[0] if chunk_ms else wall, new_tokens=sum(chunk_tokens),
                  text="".join(text), chunk_ms=chunk_ms, chunk_tokens=chunk_tokens)
    if origins:
        sample["origins"] = origins
    if sample.get("usage"):
        sample["prompt_tokens"] = sample["usage"].get("prompt_tokens")
    return sample


def decode_figures(sample: dict) -> dict:
    """request_tps, decode_tps, ttft_ms and the per-token inter-token latencies (ms) of one sample."""
    wall, n = sample.get("wall_ms"), sample.get("new_tokens") or 0
    times, counts = sample.get("chunk_ms") or [], sample.get("chunk_tokens") or []
    out = {"ttft_ms": sample.get("ttft_ms"), "new_tokens": n,
           "request_tps": n / wall * 1e3 if wall else None, "decode_tps": None, "itl_ms": []}
    if len(times) >= 2:
        span = times[-1] - times[0]
        after_first = sum(counts[1:])
        out["decode_tps"] = after_first / span * 1e3 if span > 0 else None
        for i in range(1, len(times)):
            gap = times[i] - times[i - 1]
            out["itl_ms"].extend([gap / counts[i]] * counts[i])
    return out


def percentile(xs: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation; None for no data."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)
