"""Tracing tests: the api and dispatcher in this process with a tracer provider whose spans
go to OpenTelemetry's in-memory exporter, the same provider set globally for the SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from evora import tracing
from tests.e2e.conftest import Stack, open_stack


@pytest.fixture(scope="session")
def provider() -> TracerProvider:
    # The global provider can be set once per process: set it here, for the session.
    current = trace.get_tracer_provider()
    if not isinstance(current, TracerProvider):
        trace.set_tracer_provider(TracerProvider())
        current = trace.get_tracer_provider()
    assert isinstance(current, TracerProvider)
    return current


@pytest.fixture(scope="package")
def exporter(provider: TracerProvider) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    # The provider stays global for the session: later tests' SDK spans are not kept.
    exporter.shutdown()


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    """The exporter, emptied before and after the test."""
    exporter.clear()
    yield exporter
    exporter.clear()


@pytest.fixture
def services_traced(provider: TracerProvider) -> Iterator[None]:
    """Apps created during the test trace (as `evora api` with OTEL_* set)."""
    tracing.use_provider(provider)
    yield
    tracing.use_provider(None)


@pytest.fixture
async def traced_stack(
    services_traced: None, db_url: str, pool: asyncpg.Pool
) -> AsyncIterator[Stack]:
    async with open_stack(db_url, pool) as stack:
        yield stack


@pytest.fixture
async def untraced_stack(db_url: str, pool: asyncpg.Pool) -> AsyncIterator[Stack]:
    async with open_stack(db_url, pool) as stack:
        yield stack


def named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]
