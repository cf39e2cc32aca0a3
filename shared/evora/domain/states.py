"""The job state machine (docs/architecture.md#the-state-machine).

This table is the Python view of the rule; migrations 0001 and 0013 seed the same rows into
`job_transitions`, and the trigger `jobs_transition_guard` (storage/functions/guards.sql)
lists the same moves, so the database rejects anything else. A test compares the three.
"""

from __future__ import annotations

from typing import NamedTuple

from evora.protocol.states import EventName, JobState


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
        Transition(_S.RUNNING, _S.PENDING, _E.SNOOZED),
        Transition(_S.RUNNING, _S.DLQ, _E.DEAD_LETTERED),
        Transition(_S.RUNNING, _S.CANCELLED, _E.CANCELLED),
        Transition(_S.RUNNING, _S.SUSPENDED, _E.SUSPENDED),
        Transition(_S.RUNNING, _S.WAITING, _E.AWAITING_CHILDREN),
        Transition(_S.RUNNING, _S.PENDING, _E.AWAITING_CHILDREN),
        Transition(_S.SUSPENDED, _S.PENDING, _E.RESUMED),
        Transition(_S.SUSPENDED, _S.PENDING, _E.CALLBACK_TIMED_OUT),
        Transition(_S.SUSPENDED, _S.DLQ, _E.DEAD_LETTERED),
        Transition(_S.SUSPENDED, _S.CANCELLED, _E.CANCELLED),
        Transition(_S.DLQ, _S.PENDING, _E.RETRIED),
        Transition(_S.DLQ, _S.CANCELLED, _E.CANCELLED),
        Transition(None, _S.WAITING, _E.SUBMITTED),
        Transition(_S.WAITING, _S.PENDING, _E.DEPENDENCIES_MET),
        Transition(_S.WAITING, _S.CANCELLED, _E.CANCELLED),
    }
)
