"""The drafter's Prometheus metrics (see tandem.metrics for the names every service shares)."""

from __future__ import annotations

from prometheus_client import Histogram

from tandem.metrics import COMPUTE_BUCKETS, ServiceMetrics, SpecDecodeCounters


class DrafterMetrics(ServiceMetrics):
    def __init__(self, drafter=None):
        super().__init__("drafter", sessions=getattr(drafter, "session_count", None),
                         kv_bytes=getattr(drafter, "kv_bytes", None))
        self.spec = SpecDecodeCounters(self.registry, accepted=False)
        self.draft_duration = Histogram("tandem:draft_duration_seconds", "Drafter compute per Propose "
                                        "(context sync + k steps).", buckets=COMPUTE_BUCKETS, registry=self.registry)

    def proposed(self, tokens: int, compute_ms: float) -> None:
        self.spec.observe(tokens)
        self.draft_duration.observe(compute_ms / 1e3)
