"""How a batch of events changes read-model documents: pure functions, no I/O.

A batch arrives summed up per queue and per worker (`changes`); only events that report an
error come one by one. Every document carries the outbox cursor of the last event applied
to it. The projector applies to a document only the events past its cursor, and writes it
back only if its cursor is still what was read (compare-and-set), so replaying a batch after
a crash, or any overlap, changes nothing: each event takes effect exactly once per document.

Each `apply_to_*` brings a document up to date in place and returns the MongoDB update that
does the same to the stored copy: only what changed, so a batch neither resends a queue's
latency samples (new ones are appended, the window trimmed by MongoDB) nor overwrites the
counts the refresh corrects (they move by increments).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import astuple
from typing import Any

from evora.readmodels.failures import MESSAGE_KEY_CHARS, normalise, traceback_tail
from evora.readmodels.layout import STATE_NAMES, Document
from evora.readmodels.stats import (
    BUCKET_SECONDS,
    KEEP_BUCKETS_SECONDS,
    MINUTE_FIELDS,
    NO_PERCENTILES,
    SLOT,
    bucket_of,
    hour_of,
    oldest_kept_hour,
)
from evora.storage.outbox import FailureEvent
from evora_services.projector.changes import QueueChange, WorkerChange

Cursor = tuple[int, int, int]

LATENCY_SAMPLES = 1000
FAILURE_REASONS_KEPT = 50
CURRENT_JOBS_KEPT = 1000


def cursor_of(doc: Document) -> Cursor:
    """A document's cursor as (span, xid, seq). One written before spans (xid, seq) is in
    span 0, where the checkpoint of that time continues (Projector.checkpoint)."""
    span, xid, seq = [0, *doc.get("cursor", (0, 0))][-3:]
    return int(span), int(xid), int(seq)


def unseen(doc: Document, events: Iterable[FailureEvent]) -> list[FailureEvent]:
    mark = cursor_of(doc)
    return [e for e in events if astuple(e.cursor) > mark]


def _percentiles(samples: list[float]) -> dict[str, float | None]:
    if not samples:
        return dict(NO_PERCENTILES)
    ordered = sorted(samples)
    last = len(ordered) - 1

    def at(fraction: float) -> float:
        return round(ordered[round(fraction * last)], 3)

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99)}


def new_queue(queue: str) -> Document:
    return {
        "_id": queue,
        "cursor": [0, 0, 0],
        "transitions": dict.fromkeys(STATE_NAMES, 0),
        "pruned": dict.fromkeys(STATE_NAMES, 0),
        "counts": dict.fromkeys(STATE_NAMES, 0),
        "totals": {},
        "completed_buckets": {},
        "history": {},
        "wait_samples": [],
        "run_samples": [],
        "latency_ms": {"wait": _percentiles([]), "run": _percentiles([])},
        "oldest_pending_at": None,
        "last_event_at": None,
    }


def apply_to_queue(doc: Document, change: QueueChange) -> Document:
    """Counts move with each transition, totals count events by name, completions fill
    10-second buckets, claims and completions feed wait and run latency samples (the
    LATENCY_SAMPLES most recent of each)."""
    increments = {}
    for state, delta in change.moved.items():
        # .get: a document the previous release made lacks a state added since (SUSPENDED)
        doc["transitions"][state] = doc["transitions"].get(state, 0) + delta
        doc["counts"][state] = doc["counts"].get(state, 0) + delta
        if delta:
            increments[f"counts.{state}"] = delta
    totals = doc["totals"]
    for event, n in change.totals.items():
        totals[event] = totals.get(event, 0) + n
    buckets = doc["completed_buckets"]
    for bucket, n in change.completed.items():
        buckets[str(bucket)] = buckets.get(str(bucket), 0) + n
    oldest_kept = bucket_of(change.at) - KEEP_BUCKETS_SECONDS // BUCKET_SECONDS
    doc["completed_buckets"] = {k: n for k, n in buckets.items() if int(k) >= oldest_kept}
    doc["last_event_at"] = change.at
    doc["cursor"] = list(astuple(change.cursor))
    changed = ("cursor", "transitions", "totals", "completed_buckets", "last_event_at")
    update: Document = {"$set": {field: doc[field] for field in changed}}
    if increments:
        update["$inc"] = increments
    minutes = _History(doc.setdefault("history", {}), max(change.minutes))
    for minute, fields in change.minutes.items():
        for field in MINUTE_FIELDS:
            if fields.get(field):  # a minute of other events only gets no row
                minutes.add(minute, field, fields[field])
    minutes.write(update)
    appended: dict[str, Any] = {}
    for kind, new in (("wait", change.waits), ("run", change.runs)):
        if new:
            kept = doc[f"{kind}_samples"] = (doc[f"{kind}_samples"] + new)[-LATENCY_SAMPLES:]
            doc["latency_ms"][kind] = update["$set"][f"latency_ms.{kind}"] = _percentiles(kept)
            appended[f"{kind}_samples"] = {"$each": new, "$slice": -LATENCY_SAMPLES}
    if appended:
        update["$push"] = appended
    return update


class _History:
    """A queue's per-minute history (see evora.readmodels.stats) brought up to date by one
    batch: only the minutes it touched are written, and the hours that fell out of the
    window are dropped. Figures of a minute already dropped (a rebuild's old events, seen
    with newer ones) are left out, so a minute is never both written and dropped."""

    def __init__(self, history: dict[str, dict[str, list[float]]], newest: int):
        self._history = history
        kept_hours = [int(hour) for hour in history]
        self._oldest_hour = oldest_kept_hour(max([newest, *(h * 60 for h in kept_hours)]))
        self._dropped = [str(hour) for hour in kept_hours if hour < self._oldest_hour]
        for hour in self._dropped:
            del history[hour]
        self._touched: set[tuple[str, str]] = set()

    def add(self, minute: int, field: str, amount: float) -> None:
        if hour_of(minute) < self._oldest_hour:
            return
        key = (str(hour_of(minute)), str(minute % 60))
        row = self._history.setdefault(key[0], {}).setdefault(key[1], [0] * len(MINUTE_FIELDS))
        row[SLOT[field]] = round(row[SLOT[field]] + amount, 3)
        self._touched.add(key)

    def write(self, update: Document) -> None:
        for hour, minute in self._touched:
            update["$set"][f"history.{hour}.{minute}"] = self._history[hour][minute]
        if self._dropped:
            update["$unset"] = {f"history.{hour}": "" for hour in self._dropped}


def recount(doc: Document) -> None:
    """Counts are the transitions seen minus the finished jobs the sweeper pruned, so they
    equal PostgreSQL's own counts once the projector has caught up."""
    doc["counts"] = {s: doc["transitions"].get(s, 0) - doc["pruned"].get(s, 0) for s in STATE_NAMES}


def new_worker(worker_id: str) -> Document:
    return {
        "_id": worker_id,
        "cursor": [0, 0, 0],
        "first_seen": None,
        "last_seen": None,
        "queues": [],
        "claimed": 0,
        "completed": 0,
        "failed": 0,
        "released": 0,
        "lease_expired": 0,
        "current_jobs": [],
    }


def apply_to_worker(doc: Document, change: WorkerChange) -> Document:
    for counter, n in change.counts.items():
        doc[counter] += n
    # jobs in the order they started running; a dict, so that removing one is cheap
    current = dict.fromkeys(doc["current_jobs"])
    for job in change.stopped:
        current.pop(job, None)
    for job in change.started:  # one that stopped and started again moves to the end
        current.pop(job, None)
        current[job] = None
    queues: list[str] = doc["queues"]
    queues.extend(queue for queue in change.queues if queue not in queues)
    doc["first_seen"] = doc["first_seen"] or change.first_at
    doc["last_seen"] = change.last_at
    doc["current_jobs"] = list(current)[-CURRENT_JOBS_KEPT:]
    doc["running"] = len(doc["current_jobs"])
    doc["cursor"] = list(astuple(change.cursor))
    return _set_all(doc)


def _set_all(doc: Document) -> Document:
    """The update that stores the whole document (a small one)."""
    return {"$set": {field: value for field, value in doc.items() if field != "_id"}}


def failure_key(queue: str, job_type: str) -> str:
    return f"{queue}\x1f{job_type}"


def new_failures(queue: str, job_type: str) -> Document:
    return {
        "_id": failure_key(queue, job_type),
        "cursor": [0, 0, 0],
        "queue": queue,
        "type": job_type,
        "failures": 0,
        "reasons": {},
    }


def apply_to_failures(doc: Document, events: Sequence[FailureEvent]) -> Document:
    """Failure reasons per (queue, type): the error type and its normalised message
    (evora.readmodels.failures), counted, with the latest example, job and stack trace; the
    FAILURE_REASONS_KEPT most frequent kept. Only the reasons that changed are written."""
    reasons: dict[str, Document] = doc["reasons"]
    touched = set()
    for e in events:
        error = e.error
        message = str(error.get("message", ""))
        error_type = error.get("type")
        pattern = normalise(message)
        key = hashlib.sha1(f"{error_type}\x1f{pattern}".encode()).hexdigest()[:16]
        reason = reasons.setdefault(key, {"type": error_type, "message": pattern, "count": 0})
        reason["count"] += 1
        reason["last_at"] = e.at
        reason["example"] = message[:MESSAGE_KEY_CHARS]
        reason["job_id"] = e.job_id
        reason["traceback"] = traceback_tail(error.get("traceback"))
        touched.add(key)
        doc["failures"] += 1
    dropped: list[str] = []
    if len(reasons) > FAILURE_REASONS_KEPT:
        kept = sorted(reasons.items(), key=lambda kv: kv[1]["count"], reverse=True)
        dropped = [key for key, _ in kept[FAILURE_REASONS_KEPT:]]
        doc["reasons"] = dict(kept[:FAILURE_REASONS_KEPT])
    doc["cursor"] = list(astuple(events[-1].cursor))
    written = {f"reasons.{key}": doc["reasons"][key] for key in touched if key in doc["reasons"]}
    update: Document = {"$set": {"cursor": doc["cursor"], "failures": doc["failures"], **written}}
    if dropped:
        update["$unset"] = {f"reasons.{key}": "" for key in dropped}
    return update
