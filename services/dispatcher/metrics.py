"""Dispatcher metrics (bounded labels: queue names and outcomes, never job ids)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from evora.http.metrics import LATENCY_BUCKETS, ServiceMetrics


class DispatcherMetrics:
    def __init__(self, base: ServiceMetrics) -> None:
        registry = base.registry
        self.waiting = Gauge(
            "evora_dispatcher_waiting_polls",
            "Long-polls waiting for jobs, by queue.",
            ["queue"],
            registry=registry,
        )
        self.claims = Counter(
            "evora_dispatcher_claims",
            "Claim attempts, by whether they found jobs (skipped: known drained, no query).",
            ["result"],
            registry=registry,
        )
        self.jobs_handed_out = Counter(
            "evora_dispatcher_jobs_claimed",
            "Jobs handed to workers, by queue.",
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
