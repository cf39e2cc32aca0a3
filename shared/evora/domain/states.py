"""The job state machine (CONTRACT section 3).

This table is the Python view of the rule; migration 0001 seeds the same rows into
`job_transitions`, which a trigger on `jobs` consults, so the database rejects anything else.
A test compares the two.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class JobState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
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
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"
    RETRIED = "retried"
    CANCEL_REQUESTED = "cancel_requested"


class Transition(NamedTuple):
    from_state: JobState | None
    to_state: JobState
    event: EventName


_S = JobState
_E = EventName

TRANSITIONS: frozenset[Transition] = frozenset(
    {
        Transition(None, _S.PENDING, _E.SUBMITTED),
        Transition(_S.PENDING, _S.RUNNING, _E.CLAIMED),
        Transition(_S.PENDING, _S.CANCELLED, _E.CANCELLED),
        Transition(_S.PENDING, _S.DLQ, _E.DEAD_LETTERED),
        Transition(_S.RUNNING, _S.COMPLETED, _E.COMPLETED),
        Transition(_S.RUNNING, _S.PENDING, _E.FAILED),
        Transition(_S.RUNNING, _S.PENDING, _E.LEASE_EXPIRED),
        Transition(_S.RUNNING, _S.PENDING, _E.RELEASED),
        Transition(_S.RUNNING, _S.DLQ, _E.DEAD_LETTERED),
        Transition(_S.RUNNING, _S.CANCELLED, _E.CANCELLED),
        Transition(_S.DLQ, _S.PENDING, _E.RETRIED),
        Transition(_S.DLQ, _S.CANCELLED, _E.CANCELLED),
    }
)
