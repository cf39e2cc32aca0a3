"""The database itself enforces the state machine (docs/architecture.md#the-state-machine),
and every change the store makes writes exactly one event carrying the job's new version."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from evora.domain.states import TRANSITIONS, Transition
from evora.protocol.jobs import Debounce, JobSubmission
from evora.protocol.states import EventName, JobState
from evora.storage.jobs import Failure, JobStore
from tests.conftest import Clock

Q = "sm"


async def _submit(store: JobStore, **fields: Any) -> UUID:
    job_id: UUID = (await store.submit(JobSubmission(queue=Q, type="t", **fields))).job["id"]
    return job_id


async def _claim(store: JobStore, job_id: UUID) -> UUID:
    claimed = await store.claim(worker_id="w1", queues=[Q], max_jobs=100)
    tokens = {j["id"]: j["lease_token"] for j in claimed}
    token: UUID = tokens[job_id]
    return token


async def _events(pool: asyncpg.Pool, job_id: UUID) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await pool.fetch(
        "SELECT event, from_state, to_state, job_version, data FROM evora.job_events "
        "WHERE job_id = $1 ORDER BY job_version",
        job_id,
    )
    return rows


async def _in_state(store: JobStore, pool: asyncpg.Pool, state: JobState) -> UUID:
    """A fresh job brought to `state` through the store."""
    if state is JobState.WAITING:
        return await _submit(store, depends_on=[await _submit(store)])
    job_id = await _submit(store, max_attempts=1)
    if state is JobState.PENDING:
        return job_id
    token = await _claim(store, job_id)
    if state is JobState.RUNNING:
        return job_id
    if state is JobState.SUSPENDED:
        await store.suspend(job_id, token, timeout_seconds=60, on_timeout="fail")
    elif state is JobState.COMPLETED:
        await store.complete(job_id, token)
    elif state is JobState.DLQ:
        await store.fail(Failure(job_id, token, "boom"))
    else:
        await store.cancel(job_id)
        await store.release(job_id, token)
    assert (await store.get(job_id))["state"] == state
    return job_id


async def test_python_table_matches_database(pool: asyncpg.Pool) -> None:
    rows = await pool.fetch("SELECT from_state, to_state, event FROM evora.job_transitions")
    in_db = {
        Transition(
            JobState(r["from_state"]) if r["from_state"] else None,
            JobState(r["to_state"]),
            EventName(r["event"]),
        )
        for r in rows
    }
    assert in_db == TRANSITIONS
    assert len(rows) == len(TRANSITIONS)


async def test_the_transition_guard_lets_through_exactly_the_table(pool: asyncpg.Pool) -> None:
    # The trigger's WHEN clause lists the legal moves (storage/functions/guards.sql): it must
    # name exactly the table's moves between states.
    definition = await pool.fetchval(
        "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgname = 'jobs_transition_guard'"
    )
    # PostgreSQL keeps `(OLD.state, NEW.state) NOT IN (...)` as one clause per legal move:
    # `((old.state <> 'DLQ'::evora.job_state) OR (new.state <> 'PENDING'::evora.job_state))`.
    state = r"'(\w+)'::(?:\w+\.)?job_state"
    listed = re.findall(rf"\(old\.state <> {state}\) OR \(new\.state <> {state}\)", definition)
    moves = {(t.from_state, t.to_state) for t in TRANSITIONS if t.from_state is not None}
    assert sorted(listed) == sorted(moves), definition


async def _assert_one_event_per_version(pool: asyncpg.Pool, job_id: UUID) -> list[str]:
    events = await _events(pool, job_id)
    version = await pool.fetchval("SELECT version FROM evora.jobs WHERE id = $1", job_id)
    assert [e["job_version"] for e in events] == list(range(1, version + 1))
    for event in events:
        if event["event"] != EventName.CANCEL_REQUESTED:
            from_state = JobState(event["from_state"]) if event["from_state"] else None
            assert (
                Transition(from_state, JobState(event["to_state"]), EventName(event["event"]))
                in TRANSITIONS
            )
    return [e["event"] for e in events]


async def test_every_allowed_transition_writes_one_event(
    store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    seen: set[tuple[str | None, str, str]] = set()

    async def record(job_id: UUID) -> None:
        await _assert_one_event_per_version(pool, job_id)
        for e in await _events(pool, job_id):
            seen.add((e["from_state"], e["to_state"], e["event"]))

    # submitted, claimed, completed
    a = await _submit(store)
    await store.complete(a, await _claim(store, a))
    await record(a)
    # PENDING -> CANCELLED
    b = await _submit(store)
    assert (await store.cancel(b)).immediate
    await record(b)
    # PENDING -> DLQ (expired), then DLQ -> PENDING (retried), then PENDING -> RUNNING -> DLQ
    c = await _submit(store, expires_at=datetime(2000, 1, 1, tzinfo=UTC), max_attempts=1)
    assert [j["id"] for j in await store.expire_ttls()] == [c]
    await store.retry(c)
    await store.fail(Failure(c, await _claim(store, c), "boom"))
    await record(c)
    # RUNNING -> PENDING (failed), released, snoozed, lease_expired; DLQ -> CANCELLED
    d = await _submit(store, max_attempts=3)
    await store.fail(Failure(d, await _claim(store, d), "boom", retry_in_seconds=0))
    await store.release(d, await _claim(store, d))
    await store.snooze(d, await _claim(store, d), delay_seconds=1)
    await clock.advance(1)
    await _claim(store, d)
    # the lease runs out; then the backoff its expiry set (seconds, at this attempt) passes
    await clock.advance(3600)
    assert [j["id"] for j in await store.expire_leases()] == [d]
    await clock.advance(3600)
    await store.fail(Failure(d, await _claim(store, d), "fatal", retryable=False))
    await store.discard(d)
    await record(d)
    # RUNNING -> CANCELLED after a cancel request
    e = await _submit(store)
    token = await _claim(store, e)
    assert not (await store.cancel(e)).immediate
    await store.fail(Failure(e, token, "stopped"))
    await record(e)
    # submitted WAITING, then WAITING -> PENDING when its dependency completes
    f = await _submit(store, max_attempts=1)
    g = await _submit(store, depends_on=[f])
    await store.complete(f, await _claim(store, f))
    await record(g)
    # WAITING -> CANCELLED when its dependency is discarded from the DLQ
    h = await _submit(store, depends_on=[await _submit(store, depends_on=[g])])
    await store.fail(Failure(g, await _claim(store, g), "fatal", retryable=False))
    await store.discard(g)
    await record(h)
    # RUNNING -> SUSPENDED, then SUSPENDED -> PENDING: resumed (resolved) and
    # callback_timed_out (the attempt failed, retried); SUSPENDED -> DLQ (timed out, no
    # attempt left); SUSPENDED -> CANCELLED
    k = await _submit(store, max_attempts=2)
    s = await store.suspend(k, await _claim(store, k), timeout_seconds=60, on_timeout="fail")
    assert s.callback_id is not None
    await store.resolve_callback(s.callback_id, "go")
    for _ in range(2):
        await store.suspend(k, await _claim(store, k), timeout_seconds=60, on_timeout="fail")
        await clock.advance(3600)
        assert [j["id"] for j in await store.expire_callbacks()] == [k]
        await clock.advance(3600)  # past the retry's backoff
    await record(k)
    m = await _submit(store)
    await store.suspend(m, await _claim(store, m), timeout_seconds=60, on_timeout="fail")
    assert (await store.cancel(m)).immediate
    await record(m)
    # RUNNING -> WAITING (awaiting_children), WAITING -> PENDING when the child completes;
    # then RUNNING -> PENDING (awaiting_children) when the only child named has ended already
    p = await _submit(store)
    child = JobSubmission(queue=Q, type="child", idempotency_key="sm-child")
    [made] = (await store.spawn_children(p, await _claim(store, p), [child])).children
    await store.complete(made.id, await _claim(store, made.id))
    spawned = await store.spawn_children(p, await _claim(store, p), [child])
    assert spawned.job["state"] == JobState.PENDING
    await record(p)

    expected = {(t.from_state, t.to_state, t.event) for t in TRANSITIONS}
    assert {(f, t, ev) for f, t, ev in seen if ev != EventName.CANCEL_REQUESTED} == expected


async def test_event_data_names_the_reason(store: JobStore, pool: asyncpg.Pool) -> None:
    job = await _submit(store, max_attempts=2)
    await store.fail(Failure(job, await _claim(store, job), "oops", "KeyError", retryable=False))
    events = await _events(pool, job)
    assert events[-1]["event"] == "dead_lettered"
    assert events[-1]["data"]["reason"] == "not_retryable"
    assert events[-1]["data"]["error"] == {"message": "oops", "type": "KeyError"}
    assert (await store.get(job))["last_error"] == {"message": "oops", "type": "KeyError"}


LEGAL = {(t.from_state, t.to_state) for t in TRANSITIONS}
ILLEGAL = [
    (a, b) for a, b in itertools.product(JobState, JobState) if a != b and (a, b) not in LEGAL
]


@pytest.mark.parametrize(("from_state", "to_state"), ILLEGAL)
async def test_illegal_transition_fails_in_the_database(
    store: JobStore, pool: asyncpg.Pool, from_state: JobState, to_state: JobState
) -> None:
    job_id = await _in_state(store, pool, from_state)
    # The guard is an AFTER trigger (a BEFORE one would lock every updated row first:
    # storage/functions/guards.sql), so a move that also breaks one of the row's CHECK
    # constraints (a RUNNING job without a lease) is refused by the constraint, before it.
    with pytest.raises(
        asyncpg.CheckViolationError, match=r"illegal job transition|violates check constraint"
    ):
        await pool.execute(
            "UPDATE evora.jobs SET state = $2::evora.job_state, version = version + 1 WHERE id"
            " = $1",
            job_id,
            to_state.value,
        )
    assert (await store.get(job_id))["state"] == from_state


@pytest.mark.parametrize(
    "state", [s for s in JobState if s not in (JobState.PENDING, JobState.WAITING)]
)
async def test_new_job_must_be_pending(pool: asyncpg.Pool, state: JobState) -> None:
    with pytest.raises(asyncpg.CheckViolationError, match="must be PENDING"):
        await pool.execute(
            "INSERT INTO evora.jobs (id, queue, type, payload, state, max_attempts, lease_seconds, "
            "backoff_initial, backoff_max, backoff_multiplier, run_at, finished_at, "
            "lease_token, lease_expires_at) VALUES (gen_random_uuid(), 'q', 't', '{}', "
            "$1::evora.job_state, 1, 30, 1, 2, 2, now(), now(), gen_random_uuid(), now())",
            state.value,
        )


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE evora.job_events SET event = 'x'",
        "DELETE FROM evora.job_events",
        # the outbox's two tables (migration 0064): the `submitted` event is a row, the
        # claim's a batch
        "UPDATE evora.job_event_rows SET event = 'x'",
        "DELETE FROM evora.job_event_rows",
        "TRUNCATE evora.job_event_rows",
        "UPDATE evora.event_batches SET events = '{x}'",
        "DELETE FROM evora.event_batches",
        "TRUNCATE evora.event_batches",
    ],
)
async def test_events_are_append_only(store: JobStore, pool: asyncpg.Pool, statement: str) -> None:
    # both tables hold events: the submission's and the claim's batches, and the row of a
    # second submission the job absorbed (a debounce)
    debounce = Debounce(key="k", delay_seconds=0, max_delay_seconds=60)
    for _ in range(2):
        await _submit(store, debounce=debounce)
    assert len(await store.claim(worker_id="w", queues=[Q])) == 1
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="append-only"):
        await pool.execute(statement)
    assert await pool.fetchval("SELECT count(*) FROM evora.job_events") == 3
    assert await pool.fetchval("SELECT count(*) FROM evora.job_event_rows") == 1


@pytest.mark.parametrize("state", [JobState.PENDING, JobState.RUNNING])
async def test_live_jobs_cannot_be_deleted(
    store: JobStore, pool: asyncpg.Pool, state: JobState
) -> None:
    job_id = await _in_state(store, pool, state)
    with pytest.raises(asyncpg.CheckViolationError, match="may not be deleted"):
        await pool.execute("DELETE FROM evora.jobs WHERE id = $1", job_id)


@pytest.mark.audit_skip(
    reason="the test deletes a finished job by hand, not by retention, which counts what it removes"
)
async def test_finished_jobs_can_be_pruned(store: JobStore, pool: asyncpg.Pool) -> None:
    job_id = await _in_state(store, pool, JobState.COMPLETED)
    assert await pool.execute("DELETE FROM evora.jobs WHERE id = $1", job_id) == "DELETE 1"
