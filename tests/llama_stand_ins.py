"""Stand-ins for llama.cpp's ``llama-server`` and ``llama-bench`` (the bench tests' own: the real binaries
are built by ``python -m tandem.bench.llama_tools build`` and used only by real benchmark runs).

    python llama_stand_ins.py server --port P [...]   an OpenAI-compatible streaming chat server
    python llama_stand_ins.py bench -n N [...]        prints a llama-bench JSON report

``install(bin_dir)`` writes executables ``llama-server`` and ``llama-bench`` that run them.

The server streams one word per token, STEP_S apart, like llama-server: a first chunk with the role
only, then one chunk per token, except that token 2's text is held back and sent with token 3 (as
llama-server does for an incomplete character), a closing chunk with ``finish_reason`` and
``timings`` (``cache_n``: prompt tokens reused from an earlier request with the same messages, unless
``cache_prompt`` is false), and ``usage`` when ``stream_options.include_usage`` is set.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

STEP_S = 0.01
WORDS = "the stand in server answers with these words one token at a time until max tokens".split()
BENCH_TPS = 50.0
SEEN: set[str] = set()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = b'{"status":"ok"}' if self.path == "/health" else b"{}"
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        n = int(req.get("max_tokens", 16))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()

        def send(obj):
            self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
            self.wfile.flush()

        def chunk(delta, finish=None, **extra):
            return {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta,
                                                                                "finish_reason": finish}], **extra}

        time.sleep(STEP_S)                                   # the "prefill"
        send(chunk({"role": "assistant", "content": None}))
        held = ""
        for i in range(n):
            time.sleep(STEP_S)
            word = WORDS[i % len(WORDS)] + " "
            if i == 2:
                held = word                                  # held back, sent with the next token
                continue
            send(chunk({"content": held + word}))
            held = ""
        # llama-server's prompt cache: a prompt its slot saw before is reused unless cache_prompt is false
        prompt = json.dumps(req.get("messages"))
        cached = 7 if req.get("cache_prompt", True) and prompt in SEEN else 0
        SEEN.add(prompt)
        send(chunk({}, "length", timings={"predicted_n": n, "predicted_per_second": 1 / STEP_S, "cache_n": cached}))
        if (req.get("stream_options") or {}).get("include_usage"):
            send({"id": "x", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n,
                                                      "total_tokens": n + 7}})
        self.wfile.write(b"data: [DONE]\n\n")


def serve(argv: list[str]) -> None:
    port = int(argv[argv.index("--port") + 1])
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def bench(argv: list[str]) -> None:
    n = int(argv[argv.index("-n") + 1])
    print(json.dumps([{"build_commit": "stand-in", "build_number": 0, "n_prompt": 0, "n_gen": n,
                       "n_threads": int(argv[argv.index("-t") + 1]), "avg_ts": BENCH_TPS, "stddev_ts": 0.5,
                       "samples_ts": [BENCH_TPS] * 3, "cpu_info": "stand-in"}]))


def install(bin_dir: Path) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, kind in (("llama-server", "server"), ("llama-bench", "bench")):
        exe = bin_dir / name
        exe.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} {kind} \"$@\"\n")
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_dir


if __name__ == "__main__":
    {"server": serve, "bench": bench}[sys.argv[1]](sys.argv[2:])
    os._exit(0)
