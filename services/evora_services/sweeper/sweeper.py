"""What the active sweeper does: expire leases and TTLs as they fall due, and prune what
retention allows. Every step is a bounded batch, one short statement, so a stop or a lost
lock takes effect between batches, never inside a long transaction.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from evora.config import Settings
from evora.http.app import DATABASE_UNAVAILABLE
from evora.protocol.states import JobState
from evora.storage.jobs import EXPIRY_BATCH, JobStore
from evora.storage.retention import (
    EVENT_PARTITION_SECONDS,
    EVENT_PARTITIONS_AHEAD,
    PRUNABLE_STATES,
    RetentionStore,
)
from evora.waiting import Backoff, wait_until_set
from evora_services.sweeper.metrics import LEASE_OUTCOMES, SweeperMetrics

log = logging.getLogger(__name__)

# What an expired lease became, by the job's new state.
_LEASE_OUTCOME = {
    JobState.PENDING: "requeued",
    JobState.DLQ: "dead_lettered",
    JobState.CANCELLED: "cancelled",
}


@dataclass(frozen=True)
class Tuning:
    expiry_batch: int = EXPIRY_BATCH
    prune_batch: int = 1000
    # The deadline the sweeper sleeps until is only the earliest one it saw; a lease claimed
    # afterwards may run out sooner, so it looks again at least this often.
    max_wait: float = 1.0
    # A due row that another transaction holds is skipped (SKIP LOCKED) and stays due; this
    # floor keeps the sweeper from spinning on it until that transaction ends.
    min_wait: float = 0.05
    retention_every: float = 60.0
    # The incremental audit (docs/audit.md): a pass this often over the events since the
    # last, at most audit_batch of them (a backlog is read pass after pass, min_wait apart);
    # the sweeper's first pass starts at the events of the last audit_first_window seconds.
    audit_every: float = 60.0
    audit_batch: int = 50_000
    audit_first_window: float = 3600.0
    observe_every: float = 10.0
    standby_seconds: float = 3.0
    # The scheduler sleeps until the earliest tick it knows of, but at most this long, so a
    # schedule put elsewhere with an earlier tick is seen in time.
    schedule_max_wait: float = 1.0
    # How long a stopping sweeper may take to finish its current batches before it is
    # cancelled (a batch normally takes milliseconds; the statement timeout is 30 s).
    shutdown_grace: float = 35.0


# Waking a little after the deadline, not at it: expiry compares with `<`, by the clock of
# a statement that starts a round trip later.
_DEADLINE_MARGIN = 0.01


@dataclass(frozen=True)
class Retention:
    """How long finished jobs (by state), idempotency keys and events are kept, in seconds.
    Events go by whole partitions of `event_partition_seconds`, `event_partitions_ahead` of
    them made ahead of the clock; they also have to be projected first, and archived first
    when `archive_events` (see `RetentionStore`)."""

    jobs: Mapping[JobState, float]
    idempotency_keys: float
    events: float = 30 * 86_400.0
    archive_events: bool = False
    event_partition_seconds: int = EVENT_PARTITION_SECONDS
    event_partitions_ahead: int = EVENT_PARTITIONS_AHEAD

    @classmethod
    def from_settings(cls, settings: Settings) -> Retention:
        return cls(
            jobs={
                JobState.COMPLETED: settings.retention_completed_seconds,
                JobState.CANCELLED: settings.retention_cancelled_seconds,
                JobState.DLQ: settings.retention_dlq_seconds,
            },
            idempotency_keys=settings.retention_idempotency_seconds,
            events=settings.retention_events_seconds,
            archive_events=settings.archive_events,
            event_partition_seconds=settings.event_partition_seconds,
            event_partitions_ahead=settings.event_partitions_ahead,
        )


@dataclass(frozen=True)
class Expired:
    leases: Counter[str]  # by outcome
    ttls: int
    # attempts past max_duration_seconds and its grace (docs/jobs-that-wait.md), by outcome
    timeouts: Counter[str] = field(default_factory=Counter)
    callbacks: int = 0  # timed out

    @property
    def total(self) -> int:
        return self.leases.total() + self.ttls + self.timeouts.total() + self.callbacks


def _ended(event: asyncio.Event | None) -> bool:
    return event is not None and event.is_set()


class Sweeper:
    def __init__(
        self,
        jobs: JobStore,
        retention_store: RetentionStore,
        metrics: SweeperMetrics,
        retention: Retention,
        tuning: Tuning,
    ) -> None:
        self._jobs = jobs
        self._store = retention_store
        self._metrics = metrics
        self._retention = retention
        self._tuning = tuning
        # where the next audit pass starts (None: at those of the last audit_first_window)
        self._audit_from: int | None = None

    def set_active(self, active: bool) -> None:
        self._metrics.active.set(1 if active else 0)

    async def lead(self, ended: asyncio.Event) -> None:
        """Sweep until `ended` is set. Expiry, retention and the audit run side by side, so
        pruning a large backlog never delays a lease that runs out meanwhile."""
        await asyncio.gather(
            self._expire_forever(ended), self._prune_forever(ended), self._audit_forever(ended)
        )

    # -- expiry ------------------------------------------------------------------------

    async def expire_due(self, ended: asyncio.Event | None = None) -> Expired:
        """One pass: every lease and TTL due now, batch by batch while batches come back
        full; with `ended` set it stops after the current batch."""
        started = time.perf_counter()
        batch = self._tuning.expiry_batch
        leases: Counter[str] = Counter()
        while True:
            jobs = await self._jobs.expire_leases(batch)
            for job in jobs:
                outcome = _LEASE_OUTCOME[job["state"]]
                leases[outcome] += 1
                self._metrics.leases_expired.labels(outcome).inc()
            if len(jobs) < batch or _ended(ended):
                break
        timeouts: Counter[str] = Counter()
        while not _ended(ended):
            jobs = await self._jobs.time_out(batch)
            for job in jobs:
                outcome = _LEASE_OUTCOME[job["state"]]
                timeouts[outcome] += 1
                self._metrics.timed_out.labels(outcome).inc()
            if len(jobs) < batch:
                break
        callbacks = 0
        while not _ended(ended):
            moved = await self._jobs.expire_callbacks(batch)
            for job in moved:
                outcome = (
                    "dead_lettered"
                    if job["state"] == JobState.DLQ
                    else "resumed"
                    if job["callback"]["on_timeout"] == "resume"
                    else "requeued"
                )
                self._metrics.callbacks_timed_out.labels(outcome).inc()
            callbacks += len(moved)
            if len(moved) < batch:
                break
        ttls = 0
        while not _ended(ended):
            expired = len(await self._jobs.expire_ttls(batch))
            ttls += expired
            self._metrics.ttls_expired.inc(expired)
            if expired < batch:
                break
        self._metrics.last_run.set(time.time())
        self._metrics.pass_duration.observe(time.perf_counter() - started)
        result = Expired(leases, ttls, timeouts, callbacks)
        level = logging.INFO if result.total else logging.DEBUG
        log.log(
            level,
            "expiry pass: leases requeued=%d dead_lettered=%d cancelled=%d; "
            "timeouts requeued=%d dead_lettered=%d cancelled=%d; ttls expired=%d; "
            "callbacks timed out=%d",
            *(leases[outcome] for outcome in LEASE_OUTCOMES),
            *(timeouts[outcome] for outcome in LEASE_OUTCOMES),
            ttls,
            callbacks,
        )
        return result

    def _wait_for(self, deadline: float | None) -> float:
        if deadline is None:
            return self._tuning.max_wait
        wait = deadline + _DEADLINE_MARGIN
        return min(max(wait, self._tuning.min_wait), self._tuning.max_wait)

    async def _expire_forever(self, ended: asyncio.Event) -> None:
        backoff = Backoff()
        while not ended.is_set():
            try:
                await self.expire_due(ended)
                wait = self._wait_for(await self._store.seconds_until_deadline())
                backoff.reset()
            except Exception as exc:
                wait = backoff.next()
                log_failure("expiry", exc, wait)
            await wait_until_set(ended, wait)

    # -- retention ---------------------------------------------------------------------

    async def prune_due(self, ended: asyncio.Event | None = None) -> Counter[str]:
        """One retention pass: job_events' partitions made ahead, then finished jobs and
        idempotency keys past their windows, debounce and throttle keys that answer nothing
        more, token buckets that carry nothing (full, not throttled), in batches of one
        short statement each, and the partitions of events past theirs. Returns the rows
        (partitions, for `event_partitions`) removed by kind."""
        removed: Counter[str] = Counter()
        # First: a missing partition fails transitions, an unpruned row only waits.
        ahead = await self._store.make_event_partitions(
            self._retention.event_partition_seconds, self._retention.event_partitions_ahead
        )
        self._metrics.event_partitions_ahead.set(ahead)
        for state in PRUNABLE_STATES:
            if _ended(ended):
                break
            prune = functools.partial(
                self._store.prune_finished, state, self._retention.jobs[state]
            )
            removed[state.value.lower()] = await self._drain(state.value.lower(), prune, ended)
        if not _ended(ended):
            prune_keys = functools.partial(
                self._store.prune_idempotency_keys, self._retention.idempotency_keys
            )
            removed["idempotency_keys"] = await self._drain("idempotency_keys", prune_keys, ended)
        if not _ended(ended):
            removed["submission_keys"] = await self._drain(
                "submission_keys", self._store.prune_submission_keys, ended
            )
        if not _ended(ended):
            removed["flow_buckets"] = await self._prune_flow_buckets(ended)
        if not _ended(ended):
            dropped = await self._store.drop_event_partitions(
                self._retention.events, self._retention.archive_events
            )
            removed["event_partitions"] = dropped
            self._metrics.event_partitions_dropped.inc(dropped)
        level = logging.INFO if removed.total() else logging.DEBUG
        log.log(level, "retention pass: pruned %s", _pairs(removed))
        return removed

    async def _drain(
        self, kind: str, prune: Callable[[int], Awaitable[int]], ended: asyncio.Event | None
    ) -> int:
        batch = self._tuning.prune_batch
        total = 0
        while True:
            removed = await prune(batch)
            total += removed
            self._metrics.pruned.labels(kind).inc(removed)
            if removed < batch or _ended(ended):
                return total

    async def _prune_flow_buckets(self, ended: asyncio.Event | None) -> int:
        """The token buckets that carry nothing, a walk of all of them in key order, a batch
        of keys looked at per statement (a kept bucket is passed once a pass, not again in
        every batch as an oldest-first prune would)."""
        after: str | None = ""
        total = 0
        while after is not None and not _ended(ended):
            removed, after = await self._store.prune_flow_buckets(after, self._tuning.prune_batch)
            total += removed
            self._metrics.pruned.labels("flow_buckets").inc(removed)
        return total

    async def _prune_forever(self, ended: asyncio.Event) -> None:
        backoff = Backoff()
        while not ended.is_set():
            try:
                await self.prune_due(ended)
                wait = self._tuning.retention_every
                backoff.reset()
            except Exception as exc:
                wait = backoff.next()
                log_failure("retention", exc, wait)
            await wait_until_set(ended, wait)

    # -- the incremental audit ---------------------------------------------------------

    async def audit_due(self) -> bool:
        """One audit pass over the events after the last pass; counts and logs what it
        finds. True when it stopped at its batch (more events are waiting)."""
        report = await self._store.audit(
            since=timedelta(seconds=self._tuning.audit_first_window),
            from_seq=self._audit_from,
            max_events=self._tuning.audit_batch,
        )
        self._audit_from = report.to_seq + 1
        self._metrics.audited_events.inc(report.events)
        for check in report.checks:
            self._metrics.invariant_violations.labels(check.name).inc(len(check.violations))
            for v in check.violations:
                log.error(
                    "invariant %s violated: %s (jobs %s, events %s)",
                    check.name,
                    v.detail,
                    ", ".join(v.job_ids),
                    ", ".join(map(str, v.seqs)),
                )
        return report.events >= self._tuning.audit_batch

    async def _audit_forever(self, ended: asyncio.Event) -> None:
        backoff = Backoff()
        while not ended.is_set():
            try:
                more = await self.audit_due()
                wait = self._tuning.min_wait if more else self._tuning.audit_every
                backoff.reset()
            except Exception as exc:
                wait = backoff.next()
                log_failure("audit", exc, wait)
            await wait_until_set(ended, wait)

    # -- database health (every replica, active or not) --------------------------------

    async def observe(self) -> None:
        health = await self._store.health()
        self._metrics.oldest_writing_transaction.set(health.oldest_writing_transaction_seconds)
        self._metrics.jobs_dead_tuples.set(health.jobs_dead_tuples)
        self._metrics.event_partitions_ahead.set(health.event_partitions_ahead_seconds)

    async def observe_forever(self, stop: asyncio.Event) -> None:
        backoff = Backoff()
        while not stop.is_set():
            try:
                await self.observe()
                wait = self._tuning.observe_every
                backoff.reset()
            except Exception as exc:
                wait = backoff.next()
                log_failure("health check", exc, wait)
            await wait_until_set(stop, wait)


def _pairs(counts: Counter[str]) -> str:
    return " ".join(f"{kind}={count}" for kind, count in counts.items())


def log_failure(what: str, exc: Exception, retry_in: float) -> None:
    # An unreachable database is expected now and then (a failover, a restart) and needs no
    # traceback; anything else is a bug and gets one.
    if isinstance(exc, DATABASE_UNAVAILABLE):
        log.warning("%s failed (%r); retrying in %.1fs", what, exc, retry_in)
    else:
        log.exception("%s failed; retrying in %.1fs", what, retry_in)
