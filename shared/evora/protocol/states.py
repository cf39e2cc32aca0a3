"""The states a job can be in and the events that move it (docs/http-api.md; the legal moves
between them are in evora.domain.states)."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    # submitted with unfinished dependencies (docs/dependencies.md)
    WAITING = "WAITING"
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    # waiting for a callback, holding no lease and no limit slot (docs/callbacks.md)
    SUSPENDED = "SUSPENDED"
    COMPLETED = "COMPLETED"
    DLQ = "DLQ"
    CANCELLED = "CANCELLED"


class EventName(StrEnum):
    SUBMITTED = "submitted"
    CLAIMED = "claimed"
    COMPLETED = "completed"
    FAILED = "failed"
    LEASE_EXPIRED = "lease_expired"
    RELEASED = "released"
    SNOOZED = "snoozed"
    SUSPENDED = "suspended"
    RESUMED = "resumed"
    CALLBACK_TIMED_OUT = "callback_timed_out"
    # a running job submitted children and waits for them, WAITING (docs/jobs-that-wait.md)
    AWAITING_CHILDREN = "awaiting_children"
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"
    RETRIED = "retried"
    DEPENDENCIES_MET = "dependencies_met"
    CANCEL_REQUESTED = "cancel_requested"
    # a handler recorded a step (docs/jobs-that-wait.md); RUNNING -> RUNNING, data: its name
    CHECKPOINTED = "checkpointed"
    # a debounce key's PENDING job absorbed a submission (docs/flow-control.md)
    DEBOUNCED = "debounced"
