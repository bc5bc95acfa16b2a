"""Peak resident memory of each service.

* Services started by the bench (or given with ``--pids``): the kernel's high-water mark
  (``VmHWM`` in ``/proc/PID/status``, model loading included) and the largest RSS sampled every
  0.5 s during the timed phase (psutil, else ``/proc``).
* Live services elsewhere: a Prometheus metrics endpoint (``--metrics name=URL``), reading the first
  sample whose name mentions a peak RSS (``tandem:process_peak_rss_bytes`` or the like) or, failing
  that, ``process_resident_memory_bytes`` (current, not peak: labelled so). Otherwise "n/a".
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

PEAK_PATTERNS = (re.compile(r"peak.*(rss|resident)|(rss|resident).*peak|max_?rss", re.IGNORECASE),)
CURRENT_RSS = "process_resident_memory_bytes"


def _proc_status_kb(pid: int, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def current_rss_bytes(pid: int) -> int | None:
    try:
        import psutil

        return psutil.Process(pid).memory_info().rss
    except Exception:  # noqa: BLE001 - psutil missing or the process gone
        kb = _proc_status_kb(pid, "VmRSS")
        return kb * 1024 if kb is not None else None


def high_water_mark_bytes(pid: int) -> int | None:
    kb = _proc_status_kb(pid, "VmHWM")
    return kb * 1024 if kb is not None else None


def self_peak_rss_bytes() -> int | None:
    try:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
    except Exception:  # noqa: BLE001 - not on this platform
        return None


class RssMonitor:
    """Samples the RSS of named processes in a background thread; ``peaks()`` gives the maxima."""

    def __init__(self, pids: dict[str, int], interval_s: float = 0.5):
        self.pids = dict(pids)
        self.interval_s = interval_s
        self.max_rss: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="bench-rss")

    def _sample(self) -> None:
        for name, pid in self.pids.items():
            rss = current_rss_bytes(pid)
            if rss is not None:
                self.max_rss[name] = max(self.max_rss.get(name, 0), rss)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self):
        if self.pids:
            self._sample()
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)
        if self.pids:
            self._sample()

    def report(self) -> dict[str, dict]:
        out = {}
        for name, pid in self.pids.items():
            out[name] = {"pid": pid, "source": "process",
                         "max_rss_during_run_bytes": self.max_rss.get(name),
                         "peak_rss_bytes": high_water_mark_bytes(pid) or self.max_rss.get(name)}
        return out


def scrape_peak_rss(url: str, timeout_s: float = 5.0) -> dict:
    """Reads a Prometheus text endpoint; returns {"source", "peak_rss_bytes" or "rss_bytes", "metric"}
    or {"source": "n/a", "note": why}."""
    from tandem.bench.prometheus import samples

    try:
        found = samples(url, timeout_s)
    except Exception as exc:  # noqa: BLE001 - any failure means "not available"
        return {"source": "n/a", "note": f"metrics endpoint {url}: {type(exc).__name__}: {exc}"}
    current = None
    for sample, value in found:
        name = sample.split("{", 1)[0]
        if any(p.search(name) for p in PEAK_PATTERNS):
            return {"source": "metrics", "metric": name, "peak_rss_bytes": int(value), "url": url}
        if name == CURRENT_RSS and current is None:
            current = value
    if current is not None:
        return {"source": "metrics", "metric": CURRENT_RSS, "rss_bytes": int(current), "url": url,
                "note": "current RSS at the end of the run (the endpoint exports no peak)"}
    return {"source": "n/a", "note": f"metrics endpoint {url} exports no RSS figure"}


def fmt_bytes(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.0f} MiB"
