"""Tracing: OpenTelemetry spans across gateway, drafter and verifier, exported over OTLP.

Configured by the standard ``OTEL_*`` variables only. Tracing is ON when an OTLP endpoint is set
(``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) and not switched off
(``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``). OFF means no SDK provider, no gRPC
interceptors and span helpers that return a shared no-op object: nothing to measure.

ON: a TracerProvider (sampler from ``OTEL_TRACES_SAMPLER``/``_ARG``, resource from
``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES``, else the service's default name
``tandem-gateway`` / ``tandem-verifier`` / ``tandem-drafter``), a BatchSpanProcessor
(``OTEL_BSP_*``) and an OTLP exporter (gRPC; ``OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf`` for
port 4318). Context crosses processes in gRPC metadata (W3C traceparent) through the
``opentelemetry-instrumentation-grpc`` aio interceptors: ``server_interceptors()`` for
``start_service``, ``client_interceptors()`` for the gateway's channels.

Span tree of one request (see deploy/TRACING.md)::

    gateway  Generate (gRPC server)
               text_completion <target>            gen_ai.* + tandem.* request attributes
                 prefill  -> verifier StartSession (server) -> target.forward
                 round    -> drafter Propose (server)       -> draft
                          -> verifier Verify (server)       -> target.forward, acceptance
                 round    ...
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

from opentelemetry import trace

log = logging.getLogger(__name__)

_provider = None            # the SDK TracerProvider while tracing is on
_tracer = None              # its tracer; None = tracing off (helpers below are then no-ops)
_EXCLUDED_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection")


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def configured() -> bool:
    """Whether the environment asks for tracing (an OTLP endpoint, SDK not disabled)."""
    if _env_true("OTEL_SDK_DISABLED"):
        return False
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def enabled() -> bool:
    return _tracer is not None


class Telemetry:
    """What a service needs from tracing: interceptors to install, and a flush at shutdown."""

    def __init__(self, provider=None):
        self.provider = provider

    @property
    def enabled(self) -> bool:
        return self.provider is not None

    def server_interceptors(self) -> list:
        if self.provider is None:
            return []
        from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters

        skip = filters.any_of(*(filters.service_name(s) for s in _EXCLUDED_SERVICES))
        return [aio_server_interceptor(tracer_provider=self.provider, filter_=filters.negate(skip))]

    def client_interceptors(self) -> list:
        if self.provider is None:
            return []
        from opentelemetry.instrumentation.grpc import aio_client_interceptors

        return aio_client_interceptors(tracer_provider=self.provider)

    def shutdown(self) -> None:
        """Exports what is still queued (bounded by OTEL_BSP_EXPORT_TIMEOUT) and stops the exporter."""
        global _provider, _tracer
        if self.provider is None:
            return
        try:
            self.provider.force_flush()
            self.provider.shutdown()
        except Exception as exc:  # never let a dead collector fail a shutdown
            log.warning("tracing: flush at shutdown failed: %s", exc)
        if _provider is self.provider:
            _provider, _tracer = None, None


def _exporter():
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip().lower()
    if protocol.startswith("http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()      # endpoint, headers, TLS, timeout: from OTEL_EXPORTER_OTLP_*


def setup(default_service_name: str, exporter=None) -> Telemetry:
    """Turns tracing on for this process if the environment configures it (or ``exporter`` is given:
    tests). Returns a Telemetry; ``Telemetry().enabled`` is False when tracing stays off."""
    global _provider, _tracer
    if _provider is not None:
        return Telemetry(_provider)
    if exporter is None and not configured():
        return Telemetry()
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = service_resource(default_service_name)
    provider = TracerProvider(resource=resource)          # sampler: OTEL_TRACES_SAMPLER(_ARG)
    provider.add_span_processor(BatchSpanProcessor(exporter or _exporter()))
    trace.set_tracer_provider(provider)                   # once per process; we are the first
    _provider, _tracer = provider, provider.get_tracer("tandem")
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    print(f"[tandem] tracing on: service.name {resource.attributes.get('service.name')}, OTLP to {endpoint}",
          file=sys.stderr, flush=True)
    return Telemetry(provider)


def service_resource(default_service_name: str):
    """The SDK Resource: OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME win over the default name."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: default_service_name}))
    if "service.version" not in resource.attributes:
        try:
            from importlib.metadata import version

            resource = resource.merge(Resource({"service.version": version("tandem-spec")}))
        except Exception:
            pass
    return resource


# ---- span helpers: cheap no-ops while tracing is off -----------------------------------------------
class _Off:
    """Context manager standing in for a span while tracing is off; yields the no-op span."""

    def __enter__(self):
        return trace.INVALID_SPAN

    def __exit__(self, *exc):
        return False


_OFF = _Off()


def span(name: str, attributes: Mapping | None = None, parent=None):
    """``with span("target.forward", {...}) as s:`` a child of ``parent`` (an OTel Context) or of the
    current span, current inside the block. ``s.set_attribute`` works (and does nothing) when off."""
    if _tracer is None:
        return _OFF
    return _tracer.start_as_current_span(name, context=parent, attributes=attributes)


def context_with(span_) -> object | None:
    """An OTel Context whose current span is ``span_`` (None while tracing is off)."""
    if _tracer is None:
        return None
    return trace.set_span_in_context(span_)


def record_error(span_, exc: BaseException) -> None:
    if span_.is_recording():
        span_.record_exception(exc)
        span_.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


def tracer():
    """The process's tracer, or None while tracing is off (for spans a service builds itself)."""
    return _tracer
