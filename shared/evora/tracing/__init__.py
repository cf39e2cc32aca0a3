"""OpenTelemetry in the services (docs/tracing.md), optional: the `evora-queue[tracing]` extra.

Configured by the standard OTEL_* environment variables. Tracing is on when an exporter is
asked for (OTEL_TRACES_EXPORTER other than `none`, or an OTLP endpoint) and not disabled by
OTEL_SDK_DISABLED; otherwise nothing of OpenTelemetry is imported and every service runs as
without it. One tracer provider serves the whole process (`evora dev` runs every service in
one), so it is set up once, by the command line, before the apps are created. Every command
imports this module, `evora migrate` too, so it imports no more than that needs (no aiohttp:
an app's tracer is under evora.http.app's TRACER).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer, TracerProvider

log = logging.getLogger(__name__)

EXPORTERS = ("otlp", "console")
_OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

_provider: TracerProvider | None = None


def requested_exporters(environ: Mapping[str, str]) -> list[str]:
    """The span exporters the environment asks for; none means tracing is off. An OTLP
    endpoint alone asks for OTLP (the exporter's default), as it does in other OTel SDKs."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    raw = environ.get("OTEL_TRACES_EXPORTER")
    if raw is None:
        return ["otlp"] if any(environ.get(name) for name in _OTLP_ENDPOINTS) else []
    names = [name.strip().lower() for name in raw.split(",") if name.strip()]
    if names == ["none"]:
        return []
    unknown = sorted(set(names) - set(EXPORTERS))
    if unknown:
        raise ValueError(
            f"OTEL_TRACES_EXPORTER names {', '.join(unknown)}: supported are "
            f"{', '.join(EXPORTERS)} and none"
        )
    return names


def configure(service: str, environ: Mapping[str, str]) -> None:
    """Set up the process's tracer provider from the environment, if tracing is asked for.
    Without the `evora-queue[tracing]` extra that is a warning, not a failure: the service runs
    untraced. Spans are exported in batches, and the ones still queued at exit are sent."""
    exporters = requested_exporters(environ)
    if not exporters:
        return
    try:
        from evora.tracing.setup import provider_from_environment
    except ImportError as exc:
        log.warning(
            "tracing is configured (OTEL_*) but OpenTelemetry is not installed (%s): "
            "install 'evora-queue[tracing]'; running without tracing",
            exc,
        )
        return
    from opentelemetry import trace

    provider = provider_from_environment(f"evora-{service}", exporters, environ)
    # Global too: `evora worker`'s SDK spans, and any the handlers make, go to the same.
    trace.set_tracer_provider(provider)
    use_provider(provider)
    log.info("tracing: exporting spans with %s", ", ".join(exporters))


def use_provider(provider: TracerProvider | None) -> None:
    """The tracer provider whose tracers the apps created from now on use (None: untraced).
    `configure` sets it from the environment; an application embedding the services, or a
    test, may give its own."""
    global _provider
    _provider = provider


def tracer(scope: str) -> Tracer | None:
    """A tracer of the configured provider for an app being created, or None when the
    process does not trace."""
    return None if _provider is None else _provider.get_tracer(scope)
