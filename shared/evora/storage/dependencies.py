"""Reading the dependency graph (docs/dependencies.md): which jobs wait on a job. Deciding
when a waiting job may run is the database's (functions/dependencies.sql); what the
dependencies of a claimed job returned comes with the claim (sql/transitions.sql)."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

import asyncpg

from evora.domain.errors import JobNotFound
from evora.storage.rows import JobDict, job_from_row
from evora.storage.statements import load

DEPENDENTS, JOB_EXISTS = load("dependencies", "dependents", "job_exists")


@dataclass(frozen=True)
class DependentsPage:
    jobs: list[JobDict]
    # submit_seq to pass as `after` for the next page; None at the end
    next_after: int | None


async def dependents(
    pool: asyncpg.Pool, job_id: UUID, *, limit: int, after: int | None = None
) -> DependentsPage:
    """The jobs that depend on `job_id`, in submission order, a page at a time. A pruned
    job's dependents are still listed; a job nobody ever named is JobNotFound."""
    rows = await pool.fetch(DEPENDENTS, job_id, limit + 1, after)
    if not rows and after is None and not await pool.fetchval(JOB_EXISTS, job_id):
        raise JobNotFound(f"job {job_id} not found")
    more = len(rows) > limit
    rows = rows[:limit]
    return DependentsPage([job_from_row(r) for r in rows], rows[-1]["submit_seq"] if more else None)
