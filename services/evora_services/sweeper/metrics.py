"""Sweeper metrics. Label values are fixed sets (outcomes, kinds), created up front so every
series is exported from the first scrape, at zero."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from evora.http.metrics import LATENCY_BUCKETS, ServiceMetrics
from evora.storage.audit import CHECKS
from evora.storage.schedules import FailureReason

LEASE_OUTCOMES = ("requeued", "dead_lettered", "cancelled")
# what a callback that timed out made of its job (docs/callbacks.md): resumed (on_timeout
# resume), requeued (fail, retried), dead_lettered (dlq, or fail with no attempt left)
CALLBACK_OUTCOMES = ("resumed", "requeued", "dead_lettered")
PRUNE_KINDS = (
    "completed",
    "cancelled",
    "dlq",
    "idempotency_keys",
    "submission_keys",
    "flow_buckets",
)
# How late a schedule's job is made after its tick: on time is well under a second; a
# catch-up after downtime can be hours.
FIRE_DELAY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 86400)


class SweeperMetrics:
    def __init__(self, base: ServiceMetrics) -> None:
        registry = base.registry
        self.leases_expired = Counter(
            "evora_sweeper_leases_expired",
            "Expired leases handled, by outcome (requeued, dead_lettered, cancelled).",
            ["outcome"],
            registry=registry,
        )
        self.timed_out = Counter(
            "evora_sweeper_timed_out",
            "Attempts failed past max_duration_seconds and its grace, by outcome (requeued, "
            "dead_lettered, cancelled).",
            ["outcome"],
            registry=registry,
        )
        self.callbacks_timed_out = Counter(
            "evora_sweeper_callbacks_timed_out",
            "Callbacks whose timeout passed before a resolution, by what their job became "
            "(resumed, requeued, dead_lettered).",
            ["outcome"],
            registry=registry,
        )
        self.ttls_expired = Counter(
            "evora_sweeper_ttls_expired",
            "PENDING jobs dead-lettered because their expires_at passed.",
            registry=registry,
        )
        self.pruned = Counter(
            "evora_sweeper_pruned",
            "Rows removed by retention, by kind (completed, cancelled, dlq, idempotency_keys,"
            " submission_keys, flow_buckets).",
            ["kind"],
            registry=registry,
        )
        self.last_run = Gauge(
            "evora_sweeper_last_run_timestamp_seconds",
            "Unix time at which the last expiry pass finished.",
            registry=registry,
        )
        self.pass_duration = Histogram(
            "evora_sweeper_pass_duration_seconds",
            "Time of one expiry pass (all due leases and TTLs, batch by batch).",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.active = Gauge(
            "evora_sweeper_active",
            "1 while this replica holds the sweeper lock and sweeps.",
            registry=registry,
        )
        self.oldest_writing_transaction = Gauge(
            "evora_sweeper_oldest_writing_transaction_seconds",
            "Age of the oldest open transaction holding an xid; it pins the outbox horizon "
            "(the projector cannot read past it) and what vacuum may remove.",
            registry=registry,
        )
        self.event_partitions_dropped = Counter(
            "evora_sweeper_event_partitions_dropped",
            "Partitions of job_events retention removed whole (docs/deploy.md, Retention).",
            registry=registry,
        )
        self.event_partitions_ahead = Gauge(
            "evora_sweeper_event_partitions_ahead_seconds",
            "Seconds of job_events partitions made ahead of the clock; an event written past "
            "them fails its transition (the sweeper makes them every retention round).",
            registry=registry,
        )
        self.jobs_dead_tuples = Gauge(
            "evora_jobs_dead_tuples",
            "Dead row versions in the jobs table (pg_stat_user_tables.n_dead_tup).",
            registry=registry,
        )
        self.schedule_ticks_fired = Counter(
            "evora_schedule_ticks_fired",
            "Schedule ticks that made their job (docs/schedules.md).",
            registry=registry,
        )
        self.schedule_ticks_missed = Counter(
            "evora_schedule_ticks_missed",
            "Schedule ticks passed over without a job by their misfire policy after downtime.",
            registry=registry,
        )
        self.schedule_fire_delay = Histogram(
            "evora_schedule_fire_delay_seconds",
            "Time from a schedule's tick to the making of its job.",
            buckets=FIRE_DELAY_BUCKETS,
            registry=registry,
        )
        self.invariant_violations = Counter(
            "evora_invariant_violations",
            "Violations of the system's invariants the incremental audit found, by check "
            "(docs/audit.md).",
            ["check"],
            registry=registry,
        )
        self.audited_events = Counter(
            "evora_audit_events",
            "Job events the incremental audit has checked.",
            registry=registry,
        )
        for check in CHECKS:
            self.invariant_violations.labels(check)
        self.schedule_failures = Counter(
            "evora_schedule_failures",
            "Schedule steps that made none of their jobs, by reason (unreadable: the stored "
            "schedule no longer parses; rejected: the submission was refused). The schedule "
            "records the error (GET /v1/schedules/{name}) and waits for its next tick.",
            ["reason"],
            registry=registry,
        )
        for outcome in LEASE_OUTCOMES:
            self.leases_expired.labels(outcome)
            self.timed_out.labels(outcome)
        for outcome in CALLBACK_OUTCOMES:
            self.callbacks_timed_out.labels(outcome)
        for kind in PRUNE_KINDS:
            self.pruned.labels(kind)
        for reason in FailureReason:
            self.schedule_failures.labels(reason.value)
