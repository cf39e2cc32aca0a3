"""Projector metrics: lag, batch sizes, apply latency, MongoDB writes per event."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pymongo.asynchronous.collection import AsyncCollection

from evora.http.metrics import LATENCY_BUCKETS, ServiceMetrics
from evora.readmodels.layout import Document

# Queues with series of their own in the evora_queue_* families; the rest are only counted.
EXPORTED_QUEUES_MAX = 500
_EXPORTED_FIELDS = dict.fromkeys(("counts", "totals", "latency_ms", "oldest_pending_at"), 1)
_HOLDING_JOBS = {
    "$or": [
        {f"counts.{state}": {"$gt": 0}}
        for state in ("WAITING", "PENDING", "RUNNING", "SUSPENDED", "DLQ")
    ]
}
_MOST_RECENT_FIRST = [("last_event_at", -1), ("_id", 1)]


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
        self.unmeasured()
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
        self.history_changes = Counter(
            "evora_projector_history_changes",
            "Times the projector found PostgreSQL on another history (system identifier or "
            "timeline) than the one its checkpoint was taken on: a failover, a switchover or "
            "a restore. Each starts a rebuild of the read models.",
            registry=registry,
        )
        self.history_check_off = Gauge(
            "evora_projector_history_check_off",
            "1 while PostgreSQL refuses the projector its history (a revoked privilege, a "
            "function missing or not supported): a failover, a switchover or a restore goes "
            "unnoticed and starts no rebuild. 0 while it is read with every batch.",
            registry=registry,
        )
        self.queues = QueueGauges()
        registry.register(self.queues)

    def unmeasured(self) -> None:
        """The lag gauges of a replica that is not measuring (starting, or a standby): NaN,
        never 0, which would say "caught up" while perhaps far behind. PromQL's max() passes
        over NaN, so the active replica's figure is the one alerts and dashboards see."""
        self.events_behind.set(math.nan)
        self.seconds_behind.set(math.nan)


class QueueGauges(Collector):
    """Per-queue figures of the read models (the queue stats), exported by the active
    projector from a snapshot of its queue documents. Labels: queue, and a state, event
    name or latency kind from fixed sets. Producers name queues freely, so at most
    EXPORTED_QUEUES_MAX queues are exported: those holding pending, running or
    dead-lettered jobs first (what alerts watch), then the most recently active; the number
    left out is a gauge of its own. Empty on a standby replica."""

    def __init__(self, limit: int = EXPORTED_QUEUES_MAX) -> None:
        self._limit = limit
        self._docs: list[dict[str, Any]] = []
        self._omitted = 0

    async def update(self, queues: AsyncCollection[Document]) -> None:
        chosen = await _most_recent(queues, _HOLDING_JOBS, self._limit)
        if len(chosen) < self._limit:
            rest = {"_id": {"$nin": [doc["_id"] for doc in chosen]}}
            chosen += await _most_recent(queues, rest, self._limit - len(chosen))
        self._omitted = await queues.count_documents({}) - len(chosen)
        self._docs = chosen

    def clear(self) -> None:
        self._docs = []
        self._omitted = 0

    def collect(self) -> Iterator[Metric]:
        now = datetime.now(UTC)
        jobs = GaugeMetricFamily(
            "evora_queue_jobs",
            "Jobs per queue and state, from the read models (finished jobs until pruned).",
            labels=["queue", "state"],
        )
        age = GaugeMetricFamily(
            "evora_queue_oldest_pending_age_seconds",
            "How long the longest-waiting claimable PENDING job of the queue has been due; "
            "0 when none is due.",
            labels=["queue"],
        )
        events = CounterMetricFamily(
            "evora_queue_events",
            "Outbox events projected, by queue and event name (submitted, claimed, completed, "
            "failed, dead_lettered, lease_expired, released, retried, cancelled, ...).",
            labels=["queue", "event"],
        )
        latency = GaugeMetricFamily(
            "evora_queue_latency_seconds",
            "Wait (due to claimed) and run (claimed to completed) latency percentiles of the "
            "queue's most recent jobs, from the read models.",
            labels=["queue", "kind", "quantile"],
        )
        for doc in self._docs:
            queue = str(doc["_id"])
            for state, count in sorted(doc.get("counts", {}).items()):
                jobs.add_metric([queue, state], float(count))
            oldest = doc.get("oldest_pending_at")
            seconds = 0.0
            if isinstance(oldest, datetime):
                oldest = oldest if oldest.tzinfo else oldest.replace(tzinfo=UTC)
                seconds = max((now - oldest).total_seconds(), 0.0)
            age.add_metric([queue], seconds)
            for event, total in sorted(doc.get("totals", {}).items()):
                events.add_metric([queue, event], float(total))
            for kind, percentiles in sorted(doc.get("latency_ms", {}).items()):
                for name, millis in sorted(percentiles.items()):
                    if millis is None:  # no sample yet: no series, rather than a made-up 0
                        continue
                    quantile = f"0.{name.removeprefix('p')}"
                    latency.add_metric([queue, kind, quantile], float(millis) / 1000)
        omitted = GaugeMetricFamily(
            "evora_queue_series_omitted",
            f"Queues left out of the evora_queue_* families (at most {self._limit} exported).",
        )
        omitted.add_metric([], float(self._omitted))
        yield from (jobs, age, events, latency, omitted)


async def _most_recent(
    queues: AsyncCollection[Document], found: dict[str, Any], limit: int
) -> list[dict[str, Any]]:
    cursor = queues.find(found, _EXPORTED_FIELDS).sort(_MOST_RECENT_FIRST).limit(limit)
    return [doc async for doc in cursor]
