"""The W3C `traceparent` a job was submitted with (sql/traces.sql): kept in a side table
only for jobs that carry one, so jobs submitted without tracing cost no write and no byte."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

import asyncpg

from evora.storage.statements import load

KEEP_TRACES, TRACES_OF = load("traces", "keep_traces", "traces_of")


def carried(traceparents: Sequence[str | None] | None) -> bool:
    """Whether any submission of a set carries a traceparent (then its jobs and their
    traces are written in one transaction)."""
    return traceparents is not None and any(t is not None for t in traceparents)


async def keep(
    conn: asyncpg.Connection,
    rows: Sequence[asyncpg.Record],
    traceparents: Sequence[str | None],
) -> None:
    """Store the traceparent of each job the submit statement's `rows` created (a replay
    keeps its original's, or none); `traceparents` is in submission order. Inside the
    submission's transaction."""
    ids: list[UUID] = []
    values: list[str] = []
    for row in rows:
        traceparent = traceparents[row["ord"] - 1]
        if row["outcome"] == "created" and traceparent is not None:
            ids.append(row["id"])
            values.append(traceparent)
    if ids:
        await conn.execute(KEEP_TRACES, ids, values)


async def of(pool: asyncpg.Pool, job_ids: Sequence[UUID]) -> dict[UUID, str]:
    """The traceparents of those of `job_ids` that carry one."""
    rows = await pool.fetch(TRACES_OF, list(job_ids))
    return {row["job_id"]: row["traceparent"] for row in rows}
