"""Projector metrics: lag, batch sizes, apply latency, MongoDB writes per event."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from evora.http.metrics import LATENCY_BUCKETS, ServiceMetrics


class ProjectorMetrics:
    def __init__(self, base: ServiceMetrics) -> None:
        registry = base.registry
        self.events = Counter("evora_projector_events", "Outbox events applied.", registry=registry)
        self.writes = Counter(
            "evora_projector_mongo_writes",
            "MongoDB document writes, by collection.",
            ["collection"],
            registry=registry,
        )
        self.batch_size = Histogram(
            "evora_projector_batch_size",
            "Events per applied batch.",
            buckets=(1, 10, 50, 100, 250, 500, 1000, 2000, 5000),
            registry=registry,
        )
        self.apply_seconds = Histogram(
            "evora_projector_apply_seconds",
            "Time to apply one batch to MongoDB.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.events_behind = Gauge(
            "evora_projector_events_behind",
            "Committed outbox events not yet applied (capped at 100000).",
            registry=registry,
        )
        self.seconds_behind = Gauge(
            "evora_projector_seconds_behind",
            "Age of the oldest committed event not yet applied; 0 when caught up.",
            registry=registry,
        )
        self.last_seq = Gauge(
            "evora_projector_last_seq", "Newest event seq applied.", registry=registry
        )
        self.active = Gauge(
            "evora_projector_active",
            "1 while this replica is the active projector.",
            registry=registry,
        )
        self.conflicts = Counter(
            "evora_projector_conflicts",
            "Batches abandoned because a document changed underneath (another writer).",
            registry=registry,
        )
