"""The verifier's Prometheus metrics (see tandem.metrics for the names every service shares)."""

from __future__ import annotations

from prometheus_client import Histogram

from tandem.metrics import COMPUTE_BUCKETS, ServiceMetrics, SpecDecodeCounters


class VerifierMetrics(ServiceMetrics):
    def __init__(self, target=None):
        super().__init__("verifier", sessions=(lambda: len(target.sessions)) if target is not None else None,
                         kv_bytes=target.sessions.total_bytes if target is not None else None)
        self.spec = SpecDecodeCounters(self.registry)
        self.verify_duration = Histogram("tandem:verify_duration_seconds",
                                         "Verifier compute per Verify (target forward + acceptance).",
                                         buckets=COMPUTE_BUCKETS, registry=self.registry)
        self.prefill_duration = Histogram("tandem:prefill_duration_seconds", "Verifier compute per prefill.",
                                          buckets=COMPUTE_BUCKETS, registry=self.registry)

    def verified(self, proposed: int, accepted: int, compute_ms: float) -> None:
        self.spec.observe(proposed, accepted)
        self.verify_duration.observe(compute_ms / 1e3)

    def prefilled(self, compute_ms: float) -> None:
        self.prefill_duration.observe(compute_ms / 1e3)
