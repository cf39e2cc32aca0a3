"""Prometheus metrics: one registry per service process, `evora_*` names, bounded labels
(route templates, never ids)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ServiceMetrics:
    def __init__(self, service: str) -> None:
        self.service = service
        self.registry = CollectorRegistry(auto_describe=True)
        self.http_requests = Counter(
            "evora_http_requests",
            "HTTP requests answered, by route template and status.",
            ["service", "method", "route", "status"],
            registry=self.registry,
        )
        self.http_latency = Histogram(
            "evora_http_request_duration_seconds",
            "Time to answer an HTTP request (long-polls include their wait).",
            ["service", "method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.http_in_flight = Gauge(
            "evora_http_requests_in_flight",
            "HTTP requests being handled now.",
            ["service"],
            registry=self.registry,
        )
        self.connections_refused = Counter(
            "evora_http_connections_refused",
            "Connections answered 503 and closed because the process had as many open as "
            "EVORA_MAX_CONNECTIONS allows.",
            ["service"],
            registry=self.registry,
        )
        self.up = Gauge(
            "evora_service_info",
            "Always 1; carries the service name.",
            ["service"],
            registry=self.registry,
        )
        self.up.labels(service).set(1)
