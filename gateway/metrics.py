"""The gateway's Prometheus metrics (see tandem.metrics for the names every service shares)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from tandem.metrics import COMPUTE_BUCKETS, E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS, ServiceMetrics, SpecDecodeCounters


class GatewayMetrics(ServiceMetrics):
    def __init__(self):
        super().__init__("gateway")
        r = self.registry
        self.spec = SpecDecodeCounters(r)
        self.ttft = Histogram("tandem:time_to_first_token_seconds", "Time to the first token (prefill included).",
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("tandem:inter_token_latency_seconds",
                             "Time between consecutive emissions of a request: a round's wall time "
                             "(1..k+1 tokens each).",
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("tandem:e2e_request_latency_seconds", "Request latency, first byte to last token.",
                             buckets=E2E_BUCKETS, registry=r)
        self.round_overhead = Histogram("tandem:round_overhead_seconds",
                                        "Round wall time minus the drafter's and verifier's compute "
                                        "(network, serialization, queuing).", buckets=COMPUTE_BUCKETS, registry=r)
        self.prompt_tokens = Counter("tandem:prompt_tokens", "Prompt tokens processed.", registry=r)
        self.generation_tokens = Counter("tandem:generation_tokens", "Tokens generated.", registry=r)
        self.request_success = Counter("tandem:request_success", "Finished requests by finish reason.",
                                       ["finish_reason"], registry=r)
        self.draft_length = Counter("tandem:draft_length_chosen", "Rounds by the draft length k chosen (0: a plain "
                                    "step) and why (best, probe, pinned, no-figures).", ["k", "reason"], registry=r)

    def watch(self, status) -> None:
        """Exposes ``status()`` (Gateway.status: the draft-length choice's cost model and acceptance estimates)
        as gauges, read at each scrape."""
        self.registry.register(_DraftLengthCollector(status))

    def round(self, rnd, stats) -> None:
        """One ``gateway.rounds.Round``, after ``stats.add(rnd)``; index 0 (the prefill) gives the TTFT."""
        if rnd.index == 0:
            self.ttft.observe(stats.ttft_ms / 1e3)
            return
        self.spec.observe(rnd.proposed, rnd.accepted)
        self.draft_length.labels(k=str(rnd.k), reason=rnd.k_reason or "fixed").inc()
        self.itl.observe(rnd.round_ms / 1e3)
        self.round_overhead.observe(rnd.overhead_ms / 1e3)

    def finished(self, stats, finish_reason: str) -> None:
        """A request that ran to its end (``gateway.stats.RequestStats``)."""
        self.e2e.observe(stats.total_ms / 1e3)
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.generation_tokens.inc(stats.new_tokens)
        self.request_success.labels(finish_reason=finish_reason or "unknown").inc()


class _DraftLengthCollector:
    """tandem:draft_cost{figure} (ms: verify_ms_w<N>, draft_ms_per_token, overheads, drafter round trip) and
    tandem:acceptance_estimate{sampling, position} from the gateway's live status."""

    def __init__(self, status):
        self.status = status

    def collect(self):
        status = self.status()
        cost = GaugeMetricFamily("tandem:draft_cost", "The draft-length choice's measured costs (ms).",
                                 labels=["figure"])
        for name, value in status["cost_model"].items():
            cost.add_metric([name], float(value))
        yield cost
        acceptance = GaugeMetricFamily("tandem:acceptance_estimate", "Gateway-wide conditional acceptance per "
                                       "draft position (a1, a2, ...; a_lookup for prompt-lookup tokens, a_lookup_nN "
                                       "for those found by an N-token match; lookup_yield: the share of the lookup "
                                       "tokens the gateway predicted that the drafter sent as lookup copies).",
                                       labels=["sampling", "position"])
        for mode in ("greedy", "sampled"):
            for name, value in status[f"acceptance_{mode}"].items():
                acceptance.add_metric([mode, name], float(value))
        yield acceptance
