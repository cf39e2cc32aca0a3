"""What one batch changes in each queue and worker document, folded from the groups of
alike events PostgreSQL summed the batch up into (a few per queue and worker, however many
events the batch holds)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from evora.readmodels.stats import BUCKET_SECONDS, MINUTE_SECONDS
from evora.storage.outbox import Batch, EventGroup, OutboxCursor

# Minutes are whole buckets, so a bucket's events all fall in one minute.
assert MINUTE_SECONDS % BUCKET_SECONDS == 0

# The worker counter each event moves: a dead-lettering is a failure, unless the lease ran
# out (EventGroup.lease_expiry).
_WORKER_COUNTERS = {
    "claimed": "claimed",
    "completed": "completed",
    "failed": "failed",
    "dead_lettered": "failed",
    "released": "released",
    "lease_expired": "lease_expired",
}


@dataclass
class QueueChange:
    queue: str
    cursor: OutboxCursor  # its last event in the batch
    at: datetime  # when that event happened
    last: int  # that event's position in the batch
    moved: dict[str, int] = field(default_factory=dict)  # state -> jobs now minus before
    totals: dict[str, int] = field(default_factory=dict)  # event name -> events
    # minute since the epoch -> {event name: events, "wait_ms_sum", "wait_n", "run_ms_sum",
    # "run_n": the latency samples that fell in it}
    minutes: dict[int, dict[str, float]] = field(default_factory=dict)
    completed: dict[int, int] = field(default_factory=dict)  # bucket -> completions
    waits: list[float] = field(default_factory=list)  # due to claimed, ms, oldest first
    runs: list[float] = field(default_factory=list)  # claimed to completed, ms

    def add(self, group: EventGroup) -> None:
        n = group.events
        if group.from_state != group.to_state:
            if group.from_state is not None:
                self.moved[group.from_state] = self.moved.get(group.from_state, 0) - n
            self.moved[group.to_state] = self.moved.get(group.to_state, 0) + n
        self.totals[group.event] = self.totals.get(group.event, 0) + n
        minute = self.minutes.setdefault(group.bucket * BUCKET_SECONDS // MINUTE_SECONDS, {})
        for name, amount in (
            (group.event, n),
            ("wait_ms_sum", group.wait_ms_sum),
            ("wait_n", group.wait_n),
            ("run_ms_sum", group.run_ms_sum),
            ("run_n", group.run_n),
        ):
            minute[name] = minute.get(name, 0) + amount
        if group.event == "completed":
            self.completed[group.bucket] = self.completed.get(group.bucket, 0) + n
        if group.last > self.last:
            self.cursor, self.at, self.last = group.last_cursor, group.last_at, group.last


@dataclass
class WorkerChange:
    worker_id: str
    cursor: OutboxCursor
    first_at: datetime
    last_at: datetime
    last: int
    counts: dict[str, int] = field(default_factory=dict)  # counter -> events
    queues: list[str] = field(default_factory=list)  # in the order the batch first met them
    started: list[str] = field(default_factory=list)  # running under it after the batch
    stopped: list[str] = field(default_factory=list)  # running before, no longer after

    def add(self, group: EventGroup) -> None:
        counter = "lease_expired" if group.lease_expiry else _WORKER_COUNTERS.get(group.event)
        if counter is not None:
            self.counts[counter] = self.counts.get(counter, 0) + group.events
        if group.queue not in self.queues:
            self.queues.append(group.queue)
        if group.last > self.last:
            self.cursor, self.last_at, self.last = group.last_cursor, group.last_at, group.last


def fold(batch: Batch) -> tuple[dict[str, QueueChange], dict[str, WorkerChange]]:
    """Each queue's and worker's change, from the events that count for its document."""
    queues: dict[str, QueueChange] = {}
    workers: dict[str, WorkerChange] = {}
    # in event order, so that a worker's queues and first event come in the order met
    for group in sorted(batch.groups, key=lambda g: g.first):
        if group.for_queue:
            if group.queue not in queues:
                queues[group.queue] = QueueChange(
                    group.queue, group.last_cursor, group.last_at, group.last
                )
            queues[group.queue].add(group)
        if group.for_worker and group.worker_id is not None:
            if group.worker_id not in workers:
                workers[group.worker_id] = WorkerChange(
                    group.worker_id, group.last_cursor, group.first_at, group.last_at, group.last
                )
            workers[group.worker_id].add(group)
    for queue, (waits, runs) in batch.samples.items():
        queues[queue].waits, queues[queue].runs = waits, runs
    for worker, (started, stopped) in batch.runs.items():
        workers[worker].started, workers[worker].stopped = started, stopped
    return queues, workers
