"""Submitting jobs: new ids, idempotency keys and the answer for every item of a batch.

A key is stored with a fingerprint of the submission's fields in the same statement as its
job (sql/jobs.sql, `submit`); a key seen before replays its job when the fields match and is
an idempotency conflict when they differ. Which items of a batch created a job, replayed one
or conflicted is decided here, from the statement's rows.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from uuid import UUID

import asyncpg

from evora.domain.errors import EvoraError, IdempotencyConflict, IdempotentJobGone
from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.db import jsonb_elements
from evora.storage.rows import JobDict, job_from_row

# Runs a transition statement and settles its NOTIFY hints (JobStore._change).
Change = Callable[..., Awaitable[list[asyncpg.Record]]]


def uuid7s(count: int) -> list[UUID]:
    """Time-ordered UUIDs (RFC 9562 version 7) for new jobs: consecutive ids land on the
    same primary-key pages, where random ids would touch (and WAL-log) a page per insert
    once the table is large. One read of the system's randomness serves a whole batch."""
    head = ((time.time_ns() // 1_000_000) << 80) | (0x7 << 76) | (0b10 << 62)
    noise = os.urandom(10 * count)
    ids = []
    for start in range(0, 10 * count, 10):
        rand = int.from_bytes(noise[start : start + 10], "big")
        rand_a = rand >> 68  # 12 bits
        rand_b = rand & ((1 << 62) - 1)
        ids.append(UUID(int=head | (rand_a << 64) | rand_b))
    return ids


def _key_reused(sub: JobSubmission) -> str:
    return (
        f"idempotency key {sub.idempotency_key!r} was already used in queue {sub.queue!r} "
        "with different fields"
    )


@dataclass(frozen=True)
class Submitted:
    job: JobDict
    created: bool


async def store(
    conn: asyncpg.Connection,
    change: Change,
    submissions: Sequence[JobSubmission],
    *,
    committed: bool,
    name_repeats: bool = False,
) -> tuple[list[Submitted | EvoraError], list[asyncpg.Record]]:
    """Insert the submissions in one statement; the outcome of each (created, replayed
    or an idempotency error) and the statement's rows. With `name_repeats` (one batch
    request) a key repeated with other fields is reported by item index."""
    # Only a key needs the fingerprint: it is what a replay is compared by.
    fingerprints = [None if s.idempotency_key is None else s.fingerprint() for s in submissions]
    first_with_key: dict[tuple[str, str], int] = {}
    repeat_of: dict[int, int] = {}
    for index, sub in enumerate(submissions):
        if sub.idempotency_key is not None:
            first = first_with_key.setdefault((sub.queue, sub.idempotency_key), index)
            if first != index:
                repeat_of[index] = first
    fresh = [i for i in range(len(submissions)) if i not in repeat_of]
    ids = dict(zip(fresh, uuid7s(len(fresh)), strict=True))
    rows = [submissions[i] for i in fresh]
    inserted = await change(
        conn,
        queries.SUBMIT,
        [ids[i] for i in fresh],
        [s.queue for s in rows],
        [s.type for s in rows],
        jsonb_elements(s.payload for s in rows),
        [s.priority for s in rows],
        [s.run_at for s in rows],
        [s.delay_seconds or 0.0 for s in rows],
        [s.max_attempts for s in rows],
        [s.lease_seconds for s in rows],
        [s.backoff.initial_seconds for s in rows],
        [s.backoff.max_seconds for s in rows],
        [s.backoff.multiplier for s in rows],
        [s.expires_at for s in rows],
        [s.idempotency_key for s in rows],
        [s.group_key for s in rows],
        [fingerprints[i] for i in fresh],
        committed=committed,
    )
    created = {row["job"]["id"]: row["job"] for row in inserted}
    results: dict[int, Submitted | EvoraError] = {}
    replayed = []
    for i in fresh:
        row = created.get(ids[i])
        if row is None:
            replayed.append(i)
        else:
            results[i] = Submitted(job_from_row(row), created=True)
    # A key that was already stored is judged against the stored job, every time it
    # appears; a key new in this statement against its first appearance.
    known = set(replayed)
    replayed += [i for i, first in repeat_of.items() if first in known]
    if replayed:
        results.update(await _replays(conn, submissions, fingerprints, replayed))
    for index, first in repeat_of.items():
        if first in known:
            continue
        if fingerprints[index] != fingerprints[first]:
            results[index] = IdempotencyConflict(
                f"jobs[{index}] reuses the idempotency key of jobs[{first}] with different fields"
                if name_repeats
                else _key_reused(submissions[index])
            )
        else:
            results[index] = Submitted(job_from_row(created[ids[first]]), created=False)
    return [results[i] for i in range(len(submissions))], inserted


async def _replays(
    conn: asyncpg.Connection,
    submissions: Sequence[JobSubmission],
    fingerprints: Sequence[bytes | None],
    indexes: Sequence[int],
) -> dict[int, Submitted | EvoraError]:
    records = await conn.fetch(
        queries.IDEMPOTENT_REPLAYS,
        [submissions[i].queue for i in indexes],
        [submissions[i].idempotency_key for i in indexes],
    )
    by_key = {(r["key_queue"], r["key_name"]): r for r in records}
    results: dict[int, Submitted | EvoraError] = {}
    for i in indexes:
        sub = submissions[i]
        record = by_key.get((sub.queue, sub.idempotency_key))
        if record is None or record["id"] is None:
            results[i] = IdempotentJobGone(
                f"idempotency key {sub.idempotency_key!r} was used in queue {sub.queue!r} "
                "by a job that has since been removed"
            )
        elif bytes(record["fingerprint"]) != fingerprints[i]:
            results[i] = IdempotencyConflict(_key_reused(sub))
        else:
            results[i] = Submitted(job_from_row(record), created=False)
    return results
