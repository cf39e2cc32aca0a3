"""What the dispatcher's handlers share, under one typed app key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from evora.coalesce import Coalescer
from evora.storage.jobs import AckOutcome, Completion, Failure, JobStore
from evora_services.dispatcher.metrics import DispatcherMetrics
from evora_services.dispatcher.wakeups import Wakeups

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer


@dataclass
class Dispatch:
    store: JobStore
    wakeups: Wakeups
    metrics: DispatcherMetrics
    completions: Coalescer[Completion, AckOutcome]
    failures: Coalescer[Failure, AckOutcome]
    # Set when the process traces: claims then hand out each job's traceparent too.
    tracer: Tracer | None = None


DISPATCH = web.AppKey("dispatch", Dispatch)
