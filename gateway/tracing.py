"""The gateway's span attributes: the request span (OpenTelemetry GenAI semantic conventions plus
tandem.* figures) and one span per round, whose attributes are the round record's figures
(``tandem.round_record``). Span plumbing (setup, the no-op helpers) is ``tandem.telemetry``."""

from __future__ import annotations

from opentelemetry import trace

from tandem import telemetry
from tandem.round_record import Round, figures


def round_attributes(rnd: Round) -> dict:
    """Span attributes of one round: every figure as ``tandem.round.<name>`` (empty strings left out)."""
    return {f"tandem.round.{name}": value for name, value in figures(rnd).items() if value != ""}


def request_attributes(stats, finish_reason: str = "") -> dict:
    """GenAI semantic-convention usage and tandem.* figures of a finished request (``RequestStats``)."""
    attrs = {"gen_ai.usage.input_tokens": stats.prompt_tokens, "gen_ai.usage.output_tokens": stats.new_tokens,
             "tandem.speculative": stats.speculative, "tandem.draft_model": stats.draft_model,
             "tandem.rounds": stats.rounds, "tandem.proposed": stats.proposed, "tandem.accepted": stats.accepted,
             "tandem.mean_acceptance_length": stats.mean_acceptance_length,
             "tandem.acceptance_rate": stats.acceptance_rate, "tandem.ttft_ms": stats.ttft_ms,
             "tandem.prefill_ms": stats.prefill_ms, "tandem.draft_ms": stats.draft_ms,
             "tandem.verify_ms": stats.verify_ms, "tandem.overhead_ms": stats.overhead_ms,
             "tandem.tokens_per_second": stats.tokens_per_second}
    if stats.fallback_reason:
        attrs["tandem.fallback_reason"] = stats.fallback_reason
    if finish_reason:
        attrs["gen_ai.response.finish_reasons"] = (finish_reason,)
    return attrs


def start_request_span(params, model: str, k: int, draft_model: str):
    """The gateway's request span (GenAI semantic conventions: ``{operation} {model}``), not current;
    ``params`` is a ``gateway.engine.GenerateParams``. End it with ``end_request_span``."""
    tracer = telemetry.tracer()
    if tracer is None:
        return trace.INVALID_SPAN
    operation = "chat" if params.chat else "text_completion"
    s = params.sampling
    attrs = {"gen_ai.operation.name": operation, "gen_ai.request.model": model,
             "gen_ai.request.max_tokens": params.max_tokens, "gen_ai.request.temperature": s.temperature,
             "tandem.draft_model": draft_model, "tandem.k": k, "tandem.no_speculation": params.no_speculation}
    if s.top_p and s.top_p < 1.0:
        attrs["gen_ai.request.top_p"] = s.top_p
    if s.top_k:
        attrs["gen_ai.request.top_k"] = s.top_k
    if s.seed is not None:
        attrs["gen_ai.request.seed"] = s.seed
    return tracer.start_span(f"{operation} {model}", attributes=attrs, kind=trace.SpanKind.INTERNAL)


def end_request_span(span_, stats, finish_reason: str = "") -> None:
    if span_.is_recording():
        span_.set_attributes(request_attributes(stats, finish_reason))
    span_.end()
