"""Every SQL statement the job store issues, by name. The statements are written whole in
sql/transitions.sql (every change of a job's state, one statement each, with its event),
sql/jobs.sql (reading jobs) and sql/queues.sql (pausing, hints); only the
admin job listing is assembled here, one statement per filter combination.
"""

from __future__ import annotations

import functools

from evora.storage.statements import load

(
    CLAIM,
    HEARTBEAT,
    COMPLETE,
    FAIL,
    RELEASE,
    EXPIRE_LEASES,
    TIME_OUT,
    EXPIRE_TTLS,
    EXPIRE_CALLBACKS,
    SUSPEND,
    RESOLVE_CALLBACK,
    CANCEL,
    LEAVE_DLQ,
    REDRIVE,
    BRIEF_LOCK_WAITS,
) = load(
    "transitions",
    "claim",
    "heartbeat",
    "complete",
    "fail",
    "release",
    "expire_leases",
    "time_out",
    "expire_ttls",
    "expire_callbacks",
    "suspend",
    "resolve_callback",
    "cancel",
    "leave_dlq",
    "redrive",
    "brief_lock_waits",
)

_STATEMENT = "{{statement}}"
if BRIEF_LOCK_WAITS.count(_STATEMENT) != 1:
    raise ValueError(f"brief_lock_waits must name {_STATEMENT} once")


@functools.cache
def briefly(statement: str) -> str:
    """`statement` (a SELECT) as one that gives up, with 55P03, any lock it would wait for
    more than briefly, whether sent alone or inside a transaction (brief_lock_waits in
    sql/transitions.sql; see evora.storage.jobs.lock_contended)."""
    return BRIEF_LOCK_WAITS.replace(_STATEMENT, statement)


# children awaited without holding a slot (docs/jobs-that-wait.md)
(
    HOLD_PARENT,
    AWAIT_CHILDREN,
    RECORD_CHILDREN,
) = load(
    "children",
    "hold_parent",
    "await_children",
    "record_children",
)

GET_JOB, LISTING_PROBE, LISTING_RESUMED, JOB_EVENTS, NEXT_DUE, UNCLAIMED_JOBS = load(
    "jobs",
    "get_job",
    "listing_probe",
    "listing_resumed",
    "job_events",
    "next_due",
    "unclaimed_jobs",
)

PAUSE_QUEUE, RESUME_QUEUE, PAUSED_QUEUES, ALL_PAUSED_QUEUES, NOTIFY_QUEUES = load(
    "queues", "pause_queue", "resume_queue", "paused_queues", "all_paused_queues", "notify_queues"
)

_LIST_FILTERS = {
    "queue": "queue = ${}",
    "state": "state = ${}::evora.job_state",
    "type": "type = ${}",
}


def list_jobs(filters: tuple[str, ...], *, after: bool) -> str:
    """Newest-first keyset page, by id: a UUIDv7, ordered by the time it was made (migration
    0068). One statement per filter combination, so each gets a plan that uses its index
    instead of a generic plan full of `$n IS NULL OR ...`. The jobs at rest (every state but
    RUNNING) and the RUNNING ones are read apart, each newest first, and merged:
    jobs_listing_by_id leaves the RUNNING jobs out, so that a claim adds no entry to it
    (migration 0038); they are read through the primary key."""
    clauses = []
    for position, name in enumerate(filters, start=1):
        clauses.append(_LIST_FILTERS[name].format(position))
    limit = len(filters) + 1
    if after:
        clauses.append(f"id < ${limit + 1}")
    branches = [
        f"(SELECT * FROM evora.jobs WHERE {' AND '.join([*clauses, kind])}"
        f" ORDER BY id DESC LIMIT ${limit})"
        for kind in ("state <> 'RUNNING'", "state = 'RUNNING'")
    ]
    return f"SELECT * FROM ({' UNION ALL '.join(branches)}) AS j ORDER BY id DESC LIMIT ${limit}"
