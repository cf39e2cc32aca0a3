"""What the dispatcher's handlers share, under one typed app key."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from evora.coalesce import Coalescer
from evora.storage.jobs import AckOutcome, Completion, Failure, JobStore
from evora_services.dispatcher.metrics import DispatcherMetrics
from evora_services.dispatcher.wakeups import Wakeups


@dataclass
class Dispatch:
    store: JobStore
    wakeups: Wakeups
    metrics: DispatcherMetrics
    completions: Coalescer[Completion, AckOutcome]
    failures: Coalescer[Failure, AckOutcome]


DISPATCH = web.AppKey("dispatch", Dispatch)
