"""Job store behaviour on a real PostgreSQL: ordering, scheduling, queues, fencing, admin."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest

from evora.domain.errors import IdempotencyConflict, InvalidState, JobNotFound, LeaseLost
from evora.protocol.jobs import JobSubmission
from evora.protocol.states import JobState
from evora.storage.jobs import AckResult, Completion, Failure, JobStore
from evora.storage.outbox import oldest_due
from evora.storage.submissions import Submitted
from tests.conftest import Clock

DONE, LEASE_LOST, NOT_FOUND = AckResult.DONE, AckResult.LEASE_LOST, AckResult.NOT_FOUND


def sub(queue: str = "q", **fields: Any) -> JobSubmission:
    return JobSubmission(queue=queue, type=fields.pop("type", "t"), **fields)


async def ids(store: JobStore, *subs: JobSubmission) -> list[UUID]:
    return [s.job["id"] for s in await store.submit_batch(subs)]


async def event_count(pool: asyncpg.Pool) -> int:
    count: int = await pool.fetchval("SELECT count(*) FROM evora.job_events")
    return count


async def test_submit_each_gives_every_submission_its_own_outcome(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    [old] = await ids(store, sub(idempotency_key="old", payload=1))
    outcomes = await store.submit_each(
        [
            sub(payload="plain"),
            sub(idempotency_key="new", payload=1),
            sub(idempotency_key="new", payload=1),
            sub(idempotency_key="new", payload=2),
            sub(idempotency_key="old", payload=2),
            sub(idempotency_key="old", payload=1),
        ]
    )
    plain, new, new_again, new_other, old_other, old_again = outcomes
    assert isinstance(plain, Submitted) and plain.created
    assert isinstance(new, Submitted) and new.created
    assert isinstance(new_again, Submitted) and not new_again.created
    assert new_again.job["id"] == new.job["id"]
    assert isinstance(new_other, IdempotencyConflict)
    assert isinstance(old_other, IdempotencyConflict)
    assert isinstance(old_again, Submitted) and not old_again.created
    assert old_again.job["id"] == old
    stored = {r["id"] for r in await pool.fetch("SELECT id FROM evora.jobs")}
    assert stored == {old, plain.job["id"], new.job["id"]}


async def test_each_item_keeps_its_own_fields_whether_shared_or_not(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    # Fields every item shares travel once and are spread in SQL; the others per item. Each
    # item must come back with exactly its own values either way.
    expires = datetime(2100, 1, 1, tzinfo=UTC)
    batch = [
        sub(payload=[1, 2], priority=3, max_attempts=7, expires_at=expires),
        sub(payload=None, priority=3, max_attempts=7, expires_at=expires, group_key="g"),
        sub(payload={"a": "ü"}, priority=-4, max_attempts=7, expires_at=expires),
    ]
    created = [s.id for s in await store.submit_batch(batch, with_jobs=False)]
    rows = {
        r["id"]: r
        for r in await pool.fetch(
            "SELECT id, payload, priority, max_attempts, expires_at, group_key, backoff_max "
            "FROM evora.jobs"
        )
    }
    assert [rows[i]["payload"] for i in created] == [[1, 2], None, {"a": "ü"}]
    assert [rows[i]["priority"] for i in created] == [3, 3, -4]
    assert [rows[i]["group_key"] for i in created] == [None, "g", None]
    assert {(r["max_attempts"], r["expires_at"], r["backoff_max"]) for r in rows.values()} == {
        (7, expires, None)  # the default max_seconds, stored as NULL (migration 0067)
    }


async def test_a_zero_and_a_negative_zero_are_not_one_shared_value(store: JobStore) -> None:
    # 0.0 == -0.0 in Python, yet float8 tells them apart, and so does the idempotency
    # fingerprint: a retry of the second item alone must replay it, not conflict.
    first, second = await store.submit_batch(
        [
            sub(idempotency_key="plus", delay_seconds=0.0),
            sub(idempotency_key="minus", delay_seconds=-0.0),
        ]
    )
    [again] = await store.submit_batch([sub(idempotency_key="minus", delay_seconds=-0.0)])
    assert not again.created and again.id == second.id != first.id


async def test_a_batch_with_a_conflicting_key_stores_nothing(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    await ids(store, sub(idempotency_key="k", payload=1))
    with pytest.raises(IdempotencyConflict):
        await store.submit_batch([sub(payload="other"), sub(idempotency_key="k", payload=2)])
    with pytest.raises(IdempotencyConflict, match=r"jobs\[2\].*jobs\[1\]"):
        await store.submit_batch(
            [sub(), sub(idempotency_key="x", payload=1), sub(idempotency_key="x", payload=2)]
        )
    assert await pool.fetchval("SELECT count(*) FROM evora.jobs") == 1


async def test_claim_order_is_priority_then_run_at_then_submission(store: JobStore) -> None:
    now = datetime.now(UTC)
    late, early, urgent, first, second = await ids(
        store,
        sub(run_at=now - timedelta(seconds=1)),
        sub(run_at=now - timedelta(seconds=60)),
        sub(priority=-5),
        sub(priority=3),
        sub(priority=3),
    )
    claimed = await store.claim(worker_id="w", queues=["q"], max_jobs=10)
    assert [j["id"] for j in claimed] == [urgent, early, late, first, second]


async def test_max_jobs_types_and_queues(store: JobStore) -> None:
    a, b, c, _ = await ids(
        store, sub("a", type="x"), sub("b", type="y"), sub("a", type="x"), sub("c")
    )
    assert len(await store.claim(worker_id="w", queues=["a", "b"], max_jobs=1)) == 1
    rest = await store.claim(worker_id="w", queues=["a", "b"], max_jobs=10, types=["y"])
    assert [j["id"] for j in rest] == [b]
    last = await store.claim(worker_id="w", queues=["a", "b"], max_jobs=10)
    assert {j["id"] for j in last} | {a} == {a, c}
    assert await store.claim(worker_id="w", queues=["a", "b"], max_jobs=10) == []


async def test_claim_issues_a_fresh_lease(store: JobStore) -> None:
    [job_id] = await ids(store, sub(lease_seconds=90))
    [job] = await store.claim(worker_id="w-7", queues=["q"])
    assert job["id"] == job_id and job["state"] == "RUNNING" and job["attempt"] == 1
    assert job["worker_id"] == "w-7" and isinstance(job["lease_token"], UUID)
    lease = (job["lease_expires_at"] - job["started_at"]).total_seconds()
    assert lease == pytest.approx(90, abs=1)


async def test_delayed_jobs_wait_for_their_time(store: JobStore, clock: Clock) -> None:
    [job_id] = await ids(store, sub(delay_seconds=3600))
    assert await store.claim(worker_id="w", queues=["q"]) == []
    due = await store.seconds_until_due(["q", "empty"])
    assert due is not None and 3590 < due <= 3600
    assert await store.seconds_until_due(["empty"]) is None
    await clock.advance(3590)
    assert await store.claim(worker_id="w", queues=["q"]) == []
    due = await store.seconds_until_due(["q"])
    assert due is not None and 0 < due <= 10
    await clock.advance(10)
    assert [j["id"] for j in await store.claim(worker_id="w", queues=["q"])] == [job_id]


async def test_the_next_and_the_oldest_due_job_are_found_whatever_their_priority(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    # the next due job is read through jobs_delayed, the oldest due one a priority at a time
    # (evora.pending_priorities()): the earliest of either is neither at the lowest priority
    # nor at the highest
    for priority, delay in ((-3, 7200), (0, 600), (5, 3600), (9, -30), (2, -300), (7, -60)):
        await ids(store, sub(priority=priority, delay_seconds=max(delay, 0)))
        if delay < 0:
            await pool.execute(
                "UPDATE evora.jobs SET run_at = now() + make_interval(secs => $1)"
                " WHERE priority = $2",
                float(delay),
                priority,
            )
    await ids(store, sub("other", priority=1, delay_seconds=60))
    due = await store.seconds_until_due(["q"])
    assert due is not None and 590 < due <= 600
    due = await store.seconds_until_due(["q", "other"])
    assert due is not None and 50 < due <= 60
    assert await oldest_due(pool, ["q", "other", "empty"]) == {
        "q": await pool.fetchval("SELECT run_at FROM evora.jobs WHERE priority = 2"),
        "other": None,
        "empty": None,
    }


async def test_paused_queue_accepts_but_hands_out_nothing(store: JobStore) -> None:
    await store.pause("q")
    await store.pause("q")  # pausing twice is harmless
    [job_id] = await ids(store, sub())
    assert await store.claim(worker_id="w", queues=["q"]) == []
    assert await store.paused(["q", "other"]) == {"q"}
    await store.resume("q")
    assert [j["id"] for j in await store.claim(worker_id="w", queues=["q"])] == [job_id]
    assert await store.all_paused() == []


async def test_expired_ttl_is_not_claimed_and_dead_letters(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    soon = datetime.now(UTC) + timedelta(hours=1)
    gone, alive = await ids(
        store, sub(expires_at=datetime(2001, 1, 1, tzinfo=UTC)), sub(expires_at=soon)
    )
    assert [j["id"] for j in await store.claim(worker_id="w", queues=["q"], max_jobs=5)] == [alive]
    [expired] = await store.expire_ttls()
    assert expired["id"] == gone and expired["state"] == "DLQ"
    data = await pool.fetchval(
        "SELECT data FROM evora.job_events WHERE job_id = $1 AND event = 'dead_lettered'", gone
    )
    assert data == {"reason": "expired"}


async def test_fencing_after_release_and_reclaim(store: JobStore, pool: asyncpg.Pool) -> None:
    [job_id] = await ids(store, sub())
    [first] = await store.claim(worker_id="a", queues=["q"])
    await store.release(job_id, first["lease_token"])
    [second] = await store.claim(worker_id="b", queues=["q"])
    assert second["lease_token"] != first["lease_token"]
    assert second["attempt"] == 1  # the released claim did not count
    before = await event_count(pool)
    stale = first["lease_token"]
    with pytest.raises(LeaseLost):
        await store.heartbeat(job_id, stale)
    with pytest.raises(LeaseLost):
        await store.complete(job_id, stale)
    with pytest.raises(LeaseLost):
        await store.fail(Failure(job_id, stale, "late"))
    with pytest.raises(LeaseLost):
        await store.release(job_id, stale)
    assert await event_count(pool) == before
    job = await store.get(job_id)
    assert job["state"] == "RUNNING" and job["worker_id"] == "b"


async def test_fencing_after_lease_expiry(
    store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    [job_id] = await ids(store, sub(backoff={"initial_seconds": 0.001, "max_seconds": 0.001}))
    [first] = await store.claim(worker_id="a", queues=["q"])
    await clock.advance(first["lease_seconds"] + 1)
    [expired] = await store.expire_leases()
    assert expired["state"] == "PENDING" and expired["attempt"] == 1
    [second] = await store.claim(worker_id="b", queues=["q"])
    assert second["attempt"] == 2
    before = await event_count(pool)
    with pytest.raises(LeaseLost):
        await store.complete(job_id, first["lease_token"], {"stale": True})
    assert await event_count(pool) == before
    done = await store.complete(job_id, second["lease_token"], {"fresh": True})
    assert done["result"] == {"fresh": True}


async def test_unknown_job_is_not_found(store: JobStore) -> None:
    missing = uuid4()
    with pytest.raises(JobNotFound):
        await store.get(missing)
    with pytest.raises(JobNotFound):
        await store.complete(missing, uuid4())
    with pytest.raises(JobNotFound):
        await store.heartbeat(missing, uuid4())
    with pytest.raises(JobNotFound):
        await store.cancel(missing)
    with pytest.raises(JobNotFound):
        await store.events(missing)


async def test_heartbeat_extends_lease_and_reports_cancel(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    [job_id] = await ids(store, sub(lease_seconds=5))
    [job] = await store.claim(worker_id="w", queues=["q"])
    before = await event_count(pool)
    beat = await store.heartbeat(
        job_id, job["lease_token"], lease_seconds=600, progress={"pct": 40}
    )
    assert beat.lease_expires_at > job["lease_expires_at"] + timedelta(seconds=500)
    assert not beat.cancel_requested
    assert await event_count(pool) == before  # heartbeats write no event
    await store.cancel(job_id)
    beat = await store.heartbeat(job_id, job["lease_token"])
    assert beat.cancel_requested
    assert (await store.get(job_id))["progress"] == {"pct": 40}


async def test_complete_is_idempotent_for_the_same_token(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    [job_id] = await ids(store, sub())
    [job] = await store.claim(worker_id="w", queues=["q"])
    done = await store.complete(job_id, job["lease_token"], {"n": 1})
    events = await event_count(pool)
    again = await store.complete(job_id, job["lease_token"], {"n": 1})
    assert again == done
    assert await event_count(pool) == events


async def test_batch_acks_report_each_outcome(store: JobStore) -> None:
    a, b, c = await ids(store, sub(), sub(), sub())
    claimed = {
        j["id"]: j["lease_token"]
        for j in await store.claim(worker_id="w", queues=["q"], max_jobs=3)
    }
    outcomes = await store.complete_many(
        [
            Completion(a, claimed[a], 1),
            Completion(b, uuid4(), 2),  # wrong token
            Completion(uuid4(), uuid4(), 3),  # no such job
        ]
    )
    assert [o.result for o in outcomes] == [DONE, LEASE_LOST, NOT_FOUND]
    failed = await store.fail_many([Failure(c, claimed[c], "x"), Failure(a, claimed[a], "late")])
    assert [o.result for o in failed] == [DONE, LEASE_LOST]
    assert failed[0].job is not None and failed[0].job["state"] == "PENDING"


async def test_fail_retries_with_backoff_then_dead_letters(store: JobStore) -> None:
    [job_id] = await ids(
        store, sub(max_attempts=2, backoff={"initial_seconds": 10, "max_seconds": 10})
    )
    [job] = await store.claim(worker_id="w", queues=["q"])
    retry = await store.fail(Failure(job_id, job["lease_token"], "first"))
    wait = (retry["run_at"] - retry["updated_at"]).total_seconds()
    assert retry["state"] == "PENDING" and 8 <= wait <= 10
    explicit = await store.get(job_id)
    assert explicit["last_error"] == {"message": "first", "type": None}


async def test_retry_in_seconds_overrides_backoff_and_budget_runs_out(store: JobStore) -> None:
    [job_id] = await ids(store, sub(max_attempts=2))
    for attempt, expected in ((1, "PENDING"), (2, "DLQ")):
        [job] = await store.claim(worker_id="w", queues=["q"])
        assert job["attempt"] == attempt
        after = await store.fail(Failure(job_id, job["lease_token"], "e", retry_in_seconds=0))
        assert after["state"] == expected
    assert (await store.get(job_id))["finished_at"] is not None


async def test_cancel_paths(store: JobStore, pool: asyncpg.Pool) -> None:
    first, second, third = await ids(store, sub(), sub(), sub())
    claimed = {j["id"]: j for j in await store.claim(worker_id="w", queues=["q"], max_jobs=2)}
    assert set(claimed) == {first, second}
    result = await store.cancel(third)
    assert result.immediate and result.job["state"] == "CANCELLED"
    requested = await store.cancel(first)
    assert not requested.immediate and requested.job["cancel_requested"]
    assert requested.job["state"] == "RUNNING"
    events = await event_count(pool)
    again = await store.cancel(first)  # a second request changes nothing
    assert not again.immediate and await event_count(pool) == events
    await store.complete(second, claimed[second]["lease_token"])
    with pytest.raises(InvalidState):
        await store.cancel(second)
    with pytest.raises(InvalidState):
        await store.cancel(third)


async def test_release_of_cancel_requested_job_cancels_it(store: JobStore) -> None:
    [job_id] = await ids(store, sub())
    [job] = await store.claim(worker_id="w", queues=["q"])
    await store.cancel(job_id)
    released = await store.release(job_id, job["lease_token"])
    # The attempt ran until the cancel stopped it, so it stays counted.
    assert released["state"] == "CANCELLED" and released["attempt"] == 1


async def test_retry_discard_and_redrive(store: JobStore) -> None:
    jobs = await ids(store, *[sub(max_attempts=1, type="a" if i % 2 else "b") for i in range(6)])
    for job in await store.claim(worker_id="w", queues=["q"], max_jobs=10):
        await store.fail(Failure(job["id"], job["lease_token"], "x"))
    finished = await _completed(store)
    with pytest.raises(InvalidState):
        await store.retry(finished)
    with pytest.raises(InvalidState):
        await store.discard(finished)
    retried = await store.retry(jobs[0])
    assert retried["state"] == "PENDING" and retried["attempt"] == 0
    discarded = await store.discard(jobs[2])
    assert discarded["state"] == "CANCELLED"
    assert await store.redrive("q", type="a", limit=2) == 2
    assert await store.redrive("q") == 2  # one of type a and one of type b were left
    assert await store.redrive("q") == 0
    states = [(await store.get(j))["state"] for j in jobs]
    assert states.count("PENDING") == 5 and states.count("CANCELLED") == 1


async def _completed(store: JobStore) -> UUID:
    [job_id] = await ids(store, sub("done"))
    [job] = await store.claim(worker_id="w", queues=["done"])
    await store.complete(job_id, job["lease_token"])
    return job_id


async def test_list_is_keyset_paginated_newest_first(store: JobStore) -> None:
    made = await ids(store, *[sub("l", type="odd" if i % 2 else "even") for i in range(7)])
    await ids(store, sub("elsewhere"))
    seen: list[UUID] = []
    after = None
    while True:
        page = await store.list_jobs(queue="l", limit=3, after=after)
        seen += [j["id"] for j in page.jobs]
        if page.next_after is None:
            break
        after = page.next_after
    assert seen == list(reversed(made))
    odd = await store.list_jobs(queue="l", type="odd", state=JobState.PENDING, limit=50)
    assert [j["id"] for j in odd.jobs] == [made[i] for i in (5, 3, 1)]
    assert odd.next_after is None
    everything = await store.list_jobs(limit=500)
    assert len(everything.jobs) == 8


async def test_list_merges_running_jobs_with_the_others_newest_first(store: JobStore) -> None:
    """The RUNNING jobs are read apart from the others (migration 0038: the listing's indexes
    leave them out); a page holds both, in one order."""
    made = await ids(store, *[sub("l") for _ in range(6)])
    running = await store.claim(worker_id="w", queues=["l"], max_jobs=3)
    assert {j["id"] for j in running} == set(made[:3])
    await store.complete(made[1], next(j["lease_token"] for j in running if j["id"] == made[1]))
    seen: list[UUID] = []
    after = None
    while True:
        page = await store.list_jobs(queue="l", limit=2, after=after)
        seen += [j["id"] for j in page.jobs]
        if page.next_after is None:
            break
        after = page.next_after
    assert seen == list(reversed(made))
    assert [j["id"] for j in (await store.list_jobs(limit=4)).jobs] == list(reversed(made))[:4]
    only_running = await store.list_jobs(queue="l", state=JobState.RUNNING, limit=50)
    assert [j["id"] for j in only_running.jobs] == [made[2], made[0]]
    pending = await store.list_jobs(state=JobState.PENDING, limit=50)
    assert [j["id"] for j in pending.jobs] == [made[5], made[4], made[3]]
