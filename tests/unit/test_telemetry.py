"""Tracing configuration from the OTEL_* variables (no exporter is started here)."""

import pytest

from tandem import telemetry


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED",
                 "OTEL_TRACES_EXPORTER", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_tracing_is_on_only_with_an_endpoint(clean_env):
    assert not telemetry.configured()
    clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4317")
    assert telemetry.configured()
    clean_env.setenv("OTEL_SDK_DISABLED", "true")
    assert not telemetry.configured()
    clean_env.delenv("OTEL_SDK_DISABLED")
    clean_env.setenv("OTEL_TRACES_EXPORTER", "none")
    assert not telemetry.configured()
    clean_env.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    clean_env.delenv("OTEL_TRACES_EXPORTER")
    clean_env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://localhost:4317")
    assert telemetry.configured()


def test_off_means_no_provider_no_interceptors_and_no_op_spans(clean_env):
    if telemetry.enabled():
        pytest.skip("tracing was turned on in this process")
    tel = telemetry.setup("tandem-gateway")
    assert not tel.enabled and tel.server_interceptors() == [] and tel.client_interceptors() == []
    with telemetry.span("round", {"a": 1}) as span:
        span.set_attribute("b", 2)
        assert not span.is_recording()
    assert telemetry.context_with(span) is None
    tel.shutdown()


def test_service_name_default_and_overrides(clean_env):
    assert telemetry.service_resource("tandem-drafter").attributes["service.name"] == "tandem-drafter"
    clean_env.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attrs,host.name=box")
    res = telemetry.service_resource("tandem-drafter").attributes
    assert res["service.name"] == "from-attrs" and res["host.name"] == "box"
    clean_env.setenv("OTEL_SERVICE_NAME", "drafter-eu")
    assert telemetry.service_resource("tandem-drafter").attributes["service.name"] == "drafter-eu"
