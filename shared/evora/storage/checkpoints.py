"""Checkpoints (docs/jobs-that-wait.md): a handler records a step's result on its job,
fenced by its lease, and the job's next attempt is handed them with its claim. The statement
is `checkpoint` in sql/checkpoints.sql."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import asyncpg

from evora.domain.errors import CheckpointsFull
from evora.protocol.bounds import MAX_CHECKPOINT_BYTES, MAX_CHECKPOINTS
from evora.storage.jobs import AckResult
from evora.storage.statements import load

(CHECKPOINT,) = load("checkpoints", "checkpoint")


async def record(
    pool: asyncpg.Pool, job_id: UUID, lease_token: UUID, name: str, data: Any
) -> dict[str, Any]:
    """Store `data` as the job's checkpoint `name` (replacing one of that name); the job's
    checkpoints after it. Raises LeaseLost (the token is not the running attempt's),
    JobNotFound, or CheckpointsFull (nothing stored)."""
    row = await pool.fetchrow(
        CHECKPOINT, job_id, lease_token, name, data, MAX_CHECKPOINTS, MAX_CHECKPOINT_BYTES
    )
    assert row is not None  # the statement answers with exactly one row
    if row["outcome"] == "too_large":
        raise CheckpointsFull(
            f"job {job_id} may hold at most {MAX_CHECKPOINTS} checkpoints of "
            f"{MAX_CHECKPOINT_BYTES} bytes in all; {name!r} was not stored"
        )
    AckResult(row["outcome"]).raise_unless_done(job_id)
    checkpoints: dict[str, Any] = row["checkpoints"]
    return checkpoints
