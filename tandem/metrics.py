"""Prometheus metrics (prometheus_client only), one registry per service, served over HTTP.

This module holds what every service shares (the registry, peak RSS, active sessions, KV bytes, vLLM's
spec-decode counters, the HTTP endpoint); each service declares its own metrics in its own ``metrics``
module (``gateway.metrics``, ``verifier_service.metrics``, ``drafter_service.metrics``).

Names follow vLLM's (``vllm:spec_decode_*`` -> ``tandem:spec_decode_*``). Counters are declared
without a suffix and exposed, like vLLM's, with ``_total`` appended by the Prometheus text format:
``tandem:spec_decode_num_drafts`` is scraped as ``tandem:spec_decode_num_drafts_total``. The
``*_created`` series are switched off. Which service exposes what:

  every service   tandem:active_sessions (gateway: requests in flight), tandem:process_peak_rss_bytes
                  (getrusage ru_maxrss); verifier and drafter: tandem:kv_cache_bytes
  gateway         tandem:spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens /
                  _num_accepted_tokens_per_pos{position}, tandem:time_to_first_token_seconds,
                  tandem:inter_token_latency_seconds (one observation per round: the round's wall time,
                  i.e. the time between two emissions of 1..k+1 tokens each, as vLLM v1 observes one per
                  engine step), tandem:e2e_request_latency_seconds,
                  tandem:round_overhead_seconds (network + serialization + queuing),
                  tandem:prompt_tokens, tandem:generation_tokens, tandem:request_success{finish_reason}
  verifier        the four spec_decode counters (of the blocks it verified, from every gateway),
                  tandem:verify_duration_seconds, tandem:prefill_duration_seconds
  drafter         tandem:spec_decode_num_drafts / _num_draft_tokens (blocks it proposed),
                  tandem:draft_duration_seconds

A draft (vLLM's "num_drafts") is one non-empty draft block, i.e. one speculative round.
"""

from __future__ import annotations

import resource
import sys
import threading

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily

prometheus_client.disable_created_metrics()

# vLLM's buckets, extended down to 1 ms: a round on a small model takes milliseconds.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
COMPUTE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0,
                   2.5, 5.0, 10.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)


class _PeakRSS:
    """Collector of the process's peak resident set size (ru_maxrss: KiB on Linux, bytes on macOS)."""

    def collect(self):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if sys.platform != "darwin":
            peak *= 1024
        yield GaugeMetricFamily("tandem:process_peak_rss_bytes", "Peak resident set size of the process.",
                                value=float(peak))


class ServiceMetrics:
    """The metrics every service has, in its own registry."""

    def __init__(self, service: str, sessions=None, kv_bytes=None):
        self.service = service
        self.registry = CollectorRegistry()
        self.registry.register(_PeakRSS())
        self.active_sessions = Gauge("tandem:active_sessions", f"Sessions the {service} holds now.",
                                     registry=self.registry)
        if sessions is not None:
            self.active_sessions.set_function(lambda: float(sessions()))
        self.kv_cache_bytes = None
        if kv_bytes is not None:            # the servers hold KV caches; the gateway does not
            self.kv_cache_bytes = Gauge("tandem:kv_cache_bytes", "Bytes of KV cache held by all sessions.",
                                        registry=self.registry)
            self.kv_cache_bytes.set_function(lambda: float(kv_bytes()))

    def text(self) -> str:
        """The exposition the HTTP endpoint serves (handy in tests and logs)."""
        return prometheus_client.generate_latest(self.registry).decode()


class SpecDecodeCounters:
    """vLLM's four spec-decode counters."""

    def __init__(self, registry: CollectorRegistry, accepted: bool = True):
        self.num_drafts = Counter("tandem:spec_decode_num_drafts", "Number of draft blocks (speculative rounds).",
                                  registry=registry)
        self.num_draft_tokens = Counter("tandem:spec_decode_num_draft_tokens", "Number of draft tokens proposed.",
                                        registry=registry)
        self.num_accepted_tokens = self.per_pos = None
        if accepted:
            self.num_accepted_tokens = Counter("tandem:spec_decode_num_accepted_tokens",
                                               "Number of draft tokens accepted.", registry=registry)
            self.per_pos = Counter("tandem:spec_decode_num_accepted_tokens_per_pos",
                                   "Accepted draft tokens by position in the block (0 = first).", ["position"],
                                   registry=registry)
        self._pos: list = []
        self._lock = threading.Lock()

    def observe(self, proposed: int, accepted: int | None = None) -> None:
        if proposed <= 0:
            return
        self.num_drafts.inc()
        self.num_draft_tokens.inc(proposed)
        if accepted is None or self.per_pos is None:
            return
        self.num_accepted_tokens.inc(accepted)
        if len(self._pos) < proposed:              # positions appear (at 0) once they have been proposed
            with self._lock:
                while len(self._pos) < proposed:
                    self._pos.append(self.per_pos.labels(position=str(len(self._pos))))
        for i in range(accepted):
            self._pos[i].inc()


class MetricsServer:
    def __init__(self, httpd, thread):
        self.httpd, self.thread = httpd, thread
        self.port = httpd.server_port

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def serve(metrics: ServiceMetrics, port: int | None, host: str = "127.0.0.1") -> MetricsServer | None:
    """Serves ``/metrics`` from a daemon thread; port None = off, 0 = a free port."""
    if port is None or port < 0:
        return None
    httpd, thread = prometheus_client.start_http_server(port, addr=host, registry=metrics.registry)
    server = MetricsServer(httpd, thread)
    print(f"[tandem] {metrics.service} metrics on http://{host}:{server.port}/metrics", file=sys.stderr, flush=True)
    return server
