"""Turning database rows into the job and event resources of docs/http-api.md."""

from __future__ import annotations

from collections.abc import Mapping
from operator import itemgetter
from typing import Any

from evora.protocol.bounds import (
    DEFAULT_BACKOFF_INITIAL_SECONDS,
    DEFAULT_BACKOFF_MAX_SECONDS,
    DEFAULT_BACKOFF_MULTIPLIER,
)

JobDict = dict[str, Any]

_JOB_FIELDS = (
    "id",
    "queue",
    "type",
    "payload",
    "state",
    "priority",
    "group_key",
    "idempotency_key",
    "attempt",
    "snoozes",
    "max_attempts",
    "lease_seconds",
    "max_duration_seconds",
    "run_at",
    "expires_at",
    "lease_expires_at",
    "worker_id",
    "cancel_requested",
    "result",
    "last_error",
    "progress",
    "checkpoints",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
    "callback",
)

_EVENT_FIELDS = (
    "seq",
    "job_id",
    "queue",
    "type",
    "event",
    "from_state",
    "to_state",
    "attempt",
    "worker_id",
    "at",
    "data",
)


# Read in C by itemgetter rather than field by field in Python: a claim turns up to a thousand
# rows into jobs at once, and the dispatcher does little else per job.
_job_fields = itemgetter(*_JOB_FIELDS)
_backoff_fields = itemgetter("backoff_initial", "backoff_max", "backoff_multiplier")


def job_from_row(row: Mapping[str, Any]) -> JobDict:
    job = dict(zip(_JOB_FIELDS, _job_fields(row), strict=True))
    initial, maximum, multiplier = _backoff_fields(row)
    # A job stores a default field of its backoff as NULL (migration 0067); evora.limits()
    # holds the same defaults (tests/sql_enqueue/test_bounds.py keeps them equal).
    job["backoff"] = {
        "initial_seconds": DEFAULT_BACKOFF_INITIAL_SECONDS if initial is None else initial,
        "max_seconds": DEFAULT_BACKOFF_MAX_SECONDS if maximum is None else maximum,
        "multiplier": DEFAULT_BACKOFF_MULTIPLIER if multiplier is None else multiplier,
    }
    job["depends_on"] = row["depends_on"] or []
    job["limit_keys"] = row["limit_keys"]
    job["fairness_key"] = row["fairness_key"]
    return job


def claimed_job_from_row(row: Mapping[str, Any]) -> JobDict:
    job = job_from_row(row)
    job["lease_token"] = row["lease_token"]
    return job


def event_from_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {name: row[name] for name in _EVENT_FIELDS}
