"""Debounce and throttle by key (docs/flow-control.md, "Debounce and throttle") in the store,
on a real PostgreSQL and the test Clock: a debounce key's PENDING job absorbs later
submissions until its max_delay, a started job is never absorbed, a throttle key answers
with its job within the window, a batch's repeats of a key make one job and a batch stays
all or nothing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import uuid4

import asyncpg
import pytest

from evora.domain.errors import InvalidDependency
from evora.protocol.jobs import Debounce, JobSubmission, Throttle
from evora.storage.jobs import JobStore
from tests.conftest import Clock

Q = "edits"


def debounced(
    payload: Any, delay: float = 10, max_delay: float = 25, **fields: Any
) -> JobSubmission:
    return JobSubmission(
        queue=Q,
        type="t",
        payload=payload,
        debounce=Debounce(key="doc:1", delay_seconds=delay, max_delay_seconds=max_delay),
        **fields,
    )


def throttled(window: float = 60) -> JobSubmission:
    return JobSubmission(queue=Q, type="t", throttle=Throttle(key="t:1", window_seconds=window))


async def jobs(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    return list(await pool.fetch("SELECT id FROM evora.jobs ORDER BY submit_seq"))


async def test_debounce_pushes_the_run_time_back_until_max_delay(
    store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    first = await store.submit(debounced({"v": 1}))
    assert first.created and first.answered_by_key is None
    made = first.job["created_at"]
    assert first.job["run_at"] == made + timedelta(seconds=10)

    await clock.advance(8)
    second = await store.submit(debounced({"v": 2}))
    assert (second.id, second.created, second.answered_by_key) == (first.id, False, "debounced")
    assert second.job["payload"] == {"v": 2}
    assert second.job["run_at"] - made == pytest.approx(
        timedelta(seconds=18), abs=timedelta(seconds=2)
    )

    await clock.advance(8)
    # now + 10 would be 26 s after the first submission: held at its max_delay, 25 s
    third = await store.submit(debounced({"v": 3}))
    assert third.id == first.id and third.job["payload"] == {"v": 3}
    assert third.job["run_at"] == made + timedelta(seconds=25)

    [row] = await jobs(pool)
    assert row["id"] == first.id
    events = await store.events(first.id)
    assert [e["event"] for e in events] == ["submitted", "debounced", "debounced"]
    assert [e["from_state"] for e in events[1:]] == ["PENDING", "PENDING"]


async def test_a_started_job_is_not_absorbed(store: JobStore, pool: asyncpg.Pool) -> None:
    first = await store.submit(debounced({"v": 1}, delay=0))
    [claimed] = await store.claim(worker_id="w", queues=[Q])
    assert claimed["id"] == first.id
    second = await store.submit(debounced({"v": 2}, delay=0))
    assert second.created and second.id != first.id
    # the running job kept its payload; the next submission goes to the new one
    assert (await store.get(first.id))["payload"] == {"v": 1}
    third = await store.submit(debounced({"v": 3}, delay=0))
    assert (third.id, third.answered_by_key) == (second.id, "debounced")
    assert len(await jobs(pool)) == 2


async def test_throttle_answers_with_the_job_of_its_window(
    store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    first = await store.submit(throttled())
    assert first.created
    await clock.advance(30)
    again = await store.submit(throttled())
    assert (again.id, again.created, again.answered_by_key) == (first.id, False, "throttled")
    # a shorter window of its own: the job is older than it
    shorter = await store.submit(throttled(window=10))
    assert shorter.created and shorter.id != first.id
    await clock.advance(61)
    later = await store.submit(throttled())
    assert later.created and later.id not in (first.id, shorter.id)
    assert len(await jobs(pool)) == 3
    # no event for an answered submission: nothing changed
    assert [e["event"] for e in await store.events(first.id)] == ["submitted"]


async def test_a_batch_repeating_a_key_makes_one_job_and_the_later_wins(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    outcomes = await store.submit_batch(
        [debounced({"v": 1}), debounced({"v": 2}), throttled(), throttled()]
    )
    assert [(o.created, o.answered_by_key) for o in outcomes] == [
        (False, "debounced"),
        (True, None),
        (True, None),
        (False, "throttled"),
    ]
    assert outcomes[0].id == outcomes[1].id and outcomes[2].id == outcomes[3].id
    assert outcomes[0].job["payload"] == {"v": 2}
    assert len(await jobs(pool)) == 2

    # then a batch of two more into the stored job: one debounced event, the last payload
    more = await store.submit_batch([debounced({"v": 3}), debounced({"v": 4})])
    assert {o.id for o in more} == {outcomes[1].id}
    assert (await store.get(outcomes[1].id))["payload"] == {"v": 4}
    events = await store.events(outcomes[1].id)
    assert [e["event"] for e in events] == ["submitted", "debounced"]
    assert events[1]["data"] == {"submissions": 2}


async def test_a_refused_batch_absorbs_nothing(store: JobStore, pool: asyncpg.Pool) -> None:
    first = await store.submit(debounced({"v": 1}))
    with pytest.raises(InvalidDependency):
        await store.submit_batch(
            [
                debounced({"v": 2}),
                throttled(),
                JobSubmission(queue=Q, type="t", depends_on=[uuid4()]),
            ]
        )
    assert [row["id"] for row in await jobs(pool)] == [first.id]
    assert (await store.get(first.id))["payload"] == {"v": 1}
    assert [e["event"] for e in await store.events(first.id)] == ["submitted"]
    assert await pool.fetchval("SELECT count(*) FROM evora.submission_keys") == 1


async def test_the_previous_releases_signature_still_stores(pool: asyncpg.Pool) -> None:
    # the 22 arguments the previous release's `submit` statement passes: no keys
    row = await pool.fetchrow(
        "SELECT ord, outcome, (job).id AS id FROM evora.store_submissions("
        "ARRAY[evora.uuid7()], '{edits}', '{t}', ARRAY['{}'::jsonb], '{0}', '{NULL}', '{NULL}', "
        "'{5}', '{30}', '{1}', '{3600}', '{2}', '{NULL}', '{NULL}', '{NULL}', '{NULL}', '{}', "
        "'{}', '{}', '{NULL}', '{}', '{}')"
    )
    assert row is not None and (row["ord"], row["outcome"]) == (1, "created")
    assert [r["id"] for r in await jobs(pool)] == [row["id"]]
