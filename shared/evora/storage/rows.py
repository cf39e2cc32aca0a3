"""Turning database rows into the job and event resources of docs/http-api.md."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
    "max_attempts",
    "lease_seconds",
    "run_at",
    "expires_at",
    "lease_expires_at",
    "worker_id",
    "cancel_requested",
    "result",
    "last_error",
    "progress",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
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


def job_from_row(row: Mapping[str, Any]) -> JobDict:
    job = {name: row[name] for name in _JOB_FIELDS}
    job["backoff"] = {
        "initial_seconds": row["backoff_initial"],
        "max_seconds": row["backoff_max"],
        "multiplier": row["backoff_multiplier"],
    }
    job["depends_on"] = row["depends_on"] or []
    job["limit_keys"] = row["limit_keys"]
    return job


def claimed_job_from_row(row: Mapping[str, Any]) -> JobDict:
    job = job_from_row(row)
    job["lease_token"] = row["lease_token"]
    return job


def event_from_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {name: row[name] for name in _EVENT_FIELDS}
