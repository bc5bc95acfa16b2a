"""The verifier's Prometheus metrics (see tandem.metrics for the names every service shares)."""

from __future__ import annotations

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tandem.metrics import COMPUTE_BUCKETS, ServiceMetrics, SpecDecodeCounters
from tandem.types import VerifyOutcome

BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512)


class VerifierMetrics(ServiceMetrics):
    def __init__(self, target=None):
        super().__init__("verifier", sessions=(lambda: len(target.sessions)) if target is not None else None,
                         kv_bytes=target.sessions.total_bytes if target is not None else None)
        self.spec = SpecDecodeCounters(self.registry)
        self.verify_duration = Histogram("tandem:verify_duration_seconds",
                                         "Verifier compute per Verify (the target forward its block was part of "
                                         "+ its acceptance).", buckets=COMPUTE_BUCKETS, registry=self.registry)
        self.prefill_duration = Histogram("tandem:prefill_duration_seconds", "Verifier compute per prefill.",
                                          buckets=COMPUTE_BUCKETS, registry=self.registry)
        self.queue_wait = Histogram("tandem:verify_queue_seconds", "Wait of a Verify's block before its forward "
                                    "(other forwards and prefill chunks ahead of it).", buckets=COMPUTE_BUCKETS,
                                    registry=self.registry)
        self.forward_rows = Histogram("tandem:forward_rows", "Rows per target forward (verify: every batched "
                                      "session's block; prefill: the chunk's tokens).", ["kind"],
                                      buckets=BATCH_BUCKETS, registry=self.registry)
        self.forward_sessions = Histogram("tandem:forward_sessions", "Sessions per verify forward.",
                                          buckets=BATCH_BUCKETS, registry=self.registry)
        if target is not None and getattr(target, "scheduler", None) is not None:
            target.scheduler.add_listener(self.forward)
        if target is not None and getattr(target, "prefix_cache", None) is not None:
            self.registry.register(PrefixCacheCollector(target.prefix_cache))
        greedy = getattr(getattr(target, "decoder", None), "greedy_head", None)
        if greedy is not None:
            self.registry.register(GreedyHeadCollector(greedy))

    def verified(self, proposed: int, outcome: VerifyOutcome) -> None:
        self.spec.observe(proposed, outcome.accepted)
        self.verify_duration.observe(outcome.compute_ms / 1e3)
        self.queue_wait.observe(outcome.queue_ms / 1e3)

    def prefilled(self, compute_ms: float) -> None:
        self.prefill_duration.observe(compute_ms / 1e3)

    def forward(self, report) -> None:
        """One forward the scheduler ran (``verifier_service.scheduler.Forward``)."""
        self.forward_rows.labels(kind=report.kind).observe(report.rows)
        if report.kind == "verify":
            self.forward_sessions.observe(report.sessions)


class PrefixCacheCollector:
    """The prefix cache's figures (``verifier_service.prefix_cache``), read at scrape time."""

    def __init__(self, cache):
        self.cache = cache

    def collect(self):
        c = self.cache
        yield CounterMetricFamily("tandem:prefix_cache_reused_tokens", "Prompt tokens whose K/V came from the prefix "
                                  "cache instead of a prefill.", value=c.reused_tokens)
        yield CounterMetricFamily("tandem:prefix_cache_prompt_tokens", "Prompt tokens of every session started "
                                  "(the reused share: reused / prompt).", value=c.prompt_tokens)
        yield CounterMetricFamily("tandem:prefix_cache_hits", "Sessions that took a prefix from the cache.",
                                  value=c.hits)
        yield GaugeMetricFamily("tandem:prefix_cache_bytes", "Bytes of K/V the prefix cache holds.", value=c.nbytes)


class GreedyHeadCollector:
    """The greedy head's figures (``verifier_service.greedy_head``), read at scrape time: how many rows of logits
    took the bound pass, and how many head rows it left to compute exactly (their ratio: what a row cost)."""

    def __init__(self, head):
        self.head = head

    def collect(self):
        yield CounterMetricFamily("tandem:greedy_head_rows", "Rows of logits of greedy sessions whose argmax came "
                                  "from the head's bound pass and its candidates, not the whole head.",
                                  value=self.head.rows)
        yield CounterMetricFamily("tandem:greedy_head_candidates", "Head rows those needed computed exactly (the "
                                  "rest could not hold the argmax).", value=self.head.candidates)
