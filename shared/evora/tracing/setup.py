"""The tracer provider built from the OTEL_* environment (imported only when tracing is on,
and needing the `evora-queue[tracing]` extra)."""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

_PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


def _exporter(name: str, environ: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    protocol = next((environ[p] for p in _PROTOCOLS if environ.get(p)), "http/protobuf")
    if protocol != "http/protobuf":
        # gRPC would bring grpcio, a far heavier dependency, for the same spans.
        raise ValueError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: Evora exports OTLP over http/protobuf only"
        )
    # The exporter reads its endpoint, headers, timeout and compression from OTEL_*.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def provider_from_environment(
    default_name: str, exporters: list[str], environ: Mapping[str, str]
) -> TracerProvider:
    """A provider exporting through `exporters`, each in batches (OTEL_BSP_* tune them);
    its resource takes OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, with `default_name`
    as the service's name when they give none."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: default_name}))
    provider = TracerProvider(resource=resource)
    for name in exporters:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name, environ)))
    return provider
