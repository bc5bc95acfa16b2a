"""Running llama.cpp's own tools for the bench: ``llama-server`` as a process on loopback, and
``llama-bench``'s decode figure (``-p 0 -n N``: generation only, no prompt), both on the target's GGUF
with the same thread count as the verifier, optionally pinned to the verifier's CPUs."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from tandem import spawn
from tandem.flags import DEFAULT_HOST


# What every request to llama-server adds: no prompt cache. The bench sends each prompt once per repeat;
# llama-server would answer a repeat's prefill from the KV its slot kept of the same prompt, which no
# fresh request gets (Tandem's verifier keeps no prompt cache across requests).
REQUEST_EXTRA = {"cache_prompt": False}


def free_port(host: str = DEFAULT_HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LlamaServer:
    """``llama-server -m GGUF -t T --parallel N`` on a free loopback port; ``with`` starts it and waits
    until ``/health`` answers 200, and stops it (SIGTERM, then SIGKILL) at the end."""

    def __init__(self, exe: Path, gguf: Path, threads: int, *, parallel: int = 1, ctx_per_slot: int = 4096,
                 cpus: str | None = None, log_path: Path | None = None, startup_timeout_s: float = 300.0):
        self.exe, self.gguf, self.threads, self.parallel = Path(exe), Path(gguf), threads, parallel
        self.ctx = ctx_per_slot * parallel
        self.cpus, self.log_path, self.startup_timeout_s = cpus, log_path, startup_timeout_s
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    @property
    def command(self) -> list[str]:
        # --jinja: the chat template stored in the GGUF, the one Tandem's gateway applies (not a built-in copy)
        return [str(self.exe), "-m", str(self.gguf), "-t", str(self.threads), "-tb", str(self.threads),
                "--host", DEFAULT_HOST, "--port", str(self.port), "-c", str(self.ctx), "--parallel",
                str(self.parallel), "--jinja", "--no-webui"]

    @property
    def url(self) -> str:
        return f"http://{DEFAULT_HOST}:{self.port}"

    def __enter__(self) -> LlamaServer:
        self.port = free_port()
        log = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        t0 = time.perf_counter()
        self.proc = spawn.popen(self.command, cpus=self.cpus, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        if log is not subprocess.DEVNULL:
            log.close()
        try:
            self._wait_healthy(t0 + self.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - t0
        return self

    def _wait_healthy(self, deadline: float) -> None:
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path else ""
                raise RuntimeError(f"llama-server exited with code {self.proc.returncode} while starting "
                                   f"({' '.join(self.command)}):\n{tail}")
            with contextlib.suppress(OSError, urllib.error.URLError):
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            time.sleep(0.2)
        raise TimeoutError(f"llama-server not healthy within {self.startup_timeout_s:.0f} s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def __exit__(self, *exc) -> None:
        self.stop()


def llama_bench(exe: Path, gguf: Path, threads: int, n_gen: int = 128, repetitions: int = 3,
                cpus: str | None = None, timeout_s: float = 900.0) -> dict:
    """``llama-bench -m GGUF -t T -n N -p 0 -r R -o json``: decode tokens/s (mean and standard
    deviation over the repetitions, as llama-bench reports them), with the command and its wall time."""
    cmd = [str(exe), "-m", str(gguf), "-t", str(threads), "-n", str(n_gen), "-p", "0", "-r", str(repetitions),
           "-o", "json"]
    t0 = time.perf_counter()
    r = spawn.run(cmd, cpus=cpus, capture_output=True, text=True, timeout=timeout_s, check=False)
    out = {"command": cmd, "wall_s": time.perf_counter() - t0, "cpus": cpus}
    if r.returncode:
        out["error"] = f"exit code {r.returncode}: {r.stderr[-1000:]}"
        return out
    return dict(out, **parse_llama_bench(r.stdout))


def parse_llama_bench(stdout: str) -> dict:
    """The decode row of llama-bench's JSON (``n_prompt`` 0): tokens/s mean and stddev, and the build."""
    try:
        rows = json.loads(stdout[stdout.index("["):])
    except ValueError as exc:
        return {"error": f"llama-bench printed no JSON ({exc}): {stdout[:300]!r}"}
    decode = [r for r in rows if r.get("n_gen") and not r.get("n_prompt")]
    if not decode:
        return {"error": "llama-bench reported no decode (-p 0 -n N) row"}
    row = decode[0]
    return {"tokens_per_s": row.get("avg_ts"), "stddev_tokens_per_s": row.get("stddev_ts"),
            "samples_ts": row.get("samples_ts"), "n_gen": row.get("n_gen"), "n_threads": row.get("n_threads"),
            "build_commit": row.get("build_commit"), "build_number": row.get("build_number"),
            "cpu_info": row.get("cpu_info"), "model_type": row.get("model_type")}
