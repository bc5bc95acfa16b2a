"""The drafter's Prometheus metrics (see tandem.metrics for the names every service shares)."""

from __future__ import annotations

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily

from tandem.metrics import COMPUTE_BUCKETS, ServiceMetrics, SpecDecodeCounters


class DrafterMetrics(ServiceMetrics):
    def __init__(self, drafter=None):
        super().__init__("drafter", sessions=getattr(drafter, "session_count", None),
                         kv_bytes=getattr(drafter, "kv_bytes", None))
        self.spec = SpecDecodeCounters(self.registry, accepted=False)
        counts = _guess_counts(drafter)
        if counts is not None:
            self.registry.register(GuessCollector(counts))
        self.draft_duration = Histogram("tandem:draft_duration_seconds", "Drafter compute per Propose "
                                        "(context sync + k steps).", buckets=COMPUTE_BUCKETS, registry=self.registry)

    def proposed(self, tokens: int, compute_ms: float) -> None:
        self.spec.observe(tokens)
        self.draft_duration.observe(compute_ms / 1e3)


def _guess_counts(drafter):
    """The guessed-row counts of ``drafter`` or of the drafter it wraps (prompt lookup, suffix drafting), if any."""
    while drafter is not None:
        counts = getattr(drafter, "guess_counts", None)
        if counts is not None:
            return counts
        drafter = getattr(drafter, "inner", None)
    return None


class GuessCollector:
    """A model drafter's guessed rows (drafter_service.guesses), read at scrape time: rows fed beside drafted
    tokens as guesses of the next, and those that were (a forward saved each), by where the guess came from."""

    def __init__(self, counts):
        self.counts = counts

    def collect(self):
        fed = CounterMetricFamily("tandem:drafter_guessed_rows", "Rows fed beside a drafted token as a guess of the "
                                  "next one, by source: the session's text or the drafter's habits.",
                                  labels=["source"])
        used = CounterMetricFamily("tandem:drafter_guessed_rows_used", "Guessed rows that were the next drafted "
                                   "token: a forward saved each.", labels=["source"])
        for source in self.counts.SOURCES:
            fed.add_metric([source], self.counts.fed[source])
            used.add_metric([source], self.counts.used[source])
        yield fed
        yield used
