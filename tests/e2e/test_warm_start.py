"""The first request after `tandem up` reports ready runs at warm speed: the services warm themselves
(forwards at every block width, a few drafter proposals) before they report SERVING. Before, the first
request ran at 2.2 tokens/s against 13 for the second (verify 0.6-3.9 s a round for ~14 rounds)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from procs import wait_until

REPO = Path(__file__).resolve().parents[2]
PROMPT = "Write a short story about a robot who learns to paint."

pytestmark = pytest.mark.integration


def _tokens_per_s(port: int, salt: str) -> float:
    """A request's tokens/s; its own ``salt`` so it never reuses the other request's prompt from the verifier's
    prefix cache (both would then not prefill alike)."""
    res = subprocess.run([sys.executable, "-m", "tandem.cli", "generate", "--gateway", f"127.0.0.1:{port}", "--chat",
                          "--max-tokens", "48", "--ignore-eos", "--json", "--cache-salt", salt, PROMPT],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr
    import json

    stats = json.loads(res.stdout)["stats"]
    # server-side: the rounds' own time, not the client's process start
    return stats["new_tokens"] / (stats["total_ms"] / 1e3)


def test_the_first_request_runs_at_warm_speed(tmp_path):
    err = open(tmp_path / "up.err", "w")
    proc = subprocess.Popen([sys.executable, "-m", "tandem.cli", "up", "--gateway-port", "0", "--http-port", "-1",
                             "--verifier-threads", "1", "--log-dir", str(tmp_path / "logs")],
                            stdout=subprocess.DEVNULL, stderr=err, cwd=REPO, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    try:
        log = tmp_path / "up.err"
        assert wait_until(lambda: "up: gateway" in log.read_text() or proc.poll() is not None, 600, 0.5), \
            log.read_text()
        text = log.read_text()
        assert "loading verifier" in text or "ready in" in text       # progress while the models load
        port = int(re.search(r"up: gateway 127\.0\.0\.1:(\d+)", text).group(1))
        first, second = _tokens_per_s(port, "first"), _tokens_per_s(port, "second")
        print(f"first request {first:.1f} tok/s, second {second:.1f} tok/s")
        assert first >= second / 1.5, (first, second)
    finally:
        proc.terminate()
        proc.wait(60)
        err.close()
