"""Dispatcher metrics (bounded labels: queue names and outcomes, never job ids).

Workers may name any queue, so queue labels are capped: a scrape holds at most
MAX_QUEUE_SERIES series per metric, and what does not fit is summed under OTHER_QUEUES.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator, Sequence

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from evora.http.metrics import LATENCY_BUCKETS, ServiceMetrics

MAX_QUEUE_SERIES = 100
# Not a valid queue name (those start with a letter or digit), so never a real queue's.
OTHER_QUEUES = "_other"


class QueueLabels:
    """The queue label of a counter: the first MAX_QUEUE_SERIES queues get their own (a
    counter's series must stay once exported), every later one counts under OTHER_QUEUES."""

    def __init__(self, limit: int = MAX_QUEUE_SERIES) -> None:
        self._limit = limit
        self._own: set[str] = set()

    def __call__(self, queue: str) -> str:
        if queue in self._own:
            return queue
        if len(self._own) < self._limit:
            self._own.add(queue)
            return queue
        return OTHER_QUEUES


class WaitingPolls(Collector):
    """Long-polls waiting now, by queue: a queue's series exists only while someone waits
    on it, and only the MAX_QUEUE_SERIES queues with the most waiting polls get one; the
    rest are summed under OTHER_QUEUES."""

    def __init__(self, limit: int = MAX_QUEUE_SERIES) -> None:
        self._limit = limit
        self._waiting: Tally[str] = Tally()

    def enter(self, queues: Sequence[str]) -> None:
        self._waiting.update(queues)

    def leave(self, queues: Sequence[str]) -> None:
        self._waiting.subtract(queues)
        for queue in queues:
            if self._waiting[queue] <= 0:
                del self._waiting[queue]

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "evora_dispatcher_waiting_polls",
            "Long-polls waiting for jobs, by queue (the busiest queues; the rest as _other).",
            labels=["queue"],
        )
        ranked = self._waiting.most_common()
        for queue, count in ranked[: self._limit]:
            family.add_metric([queue], float(count))
        rest = sum(count for _, count in ranked[self._limit :])
        if rest:
            family.add_metric([OTHER_QUEUES], float(rest))
        yield family


class DispatcherMetrics:
    def __init__(self, base: ServiceMetrics) -> None:
        registry = base.registry
        self.waiting = WaitingPolls()
        registry.register(self.waiting)
        self.queue_label = QueueLabels()
        self.claims = Counter(
            "evora_dispatcher_claims",
            "Claim attempts, by whether they found jobs (skipped: known drained, no query).",
            ["result"],
            registry=registry,
        )
        self.jobs_handed_out = Counter(
            "evora_dispatcher_jobs_claimed",
            "Jobs handed to workers, by queue (the first queues seen; later ones as _other).",
            ["queue"],
            registry=registry,
        )
        self.wakeups = Counter(
            "evora_dispatcher_wakeups",
            "Waiting long-polls woken, by cause (notify, timer, poll, chain, reconnect, shutdown).",
            ["cause"],
            registry=registry,
        )
        self.claim_latency = Histogram(
            "evora_dispatcher_claim_duration_seconds",
            "Time of one claim query.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.acks = Counter(
            "evora_dispatcher_acks",
            "Completions and failures reported by workers, by outcome and answer.",
            ["outcome", "status"],
            registry=registry,
        )
        self.released_undeliverable = Counter(
            "evora_dispatcher_undeliverable_jobs_released",
            "Claimed jobs released because the worker left before the answer.",
            registry=registry,
        )
        self.listener_connected = Gauge(
            "evora_dispatcher_listener_connected",
            "1 while the LISTEN connection is up.",
            registry=registry,
        )
