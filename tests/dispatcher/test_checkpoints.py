"""POST /v1/jobs/{id}/checkpoints (docs/jobs-that-wait.md, "Checkpoints"): a step's result is
stored on the job, fenced by the lease, and handed to the next attempt with its claim; the
event `checkpointed` names the step, never its data; a job's checkpoints are bounded in
number and size (413, nothing stored)."""

from __future__ import annotations

import asyncio
from uuid import UUID, uuid4

import asyncpg
import pytest

from evora.domain.errors import LeaseLost
from evora.protocol.bounds import MAX_CHECKPOINT_BYTES, MAX_CHECKPOINTS
from evora.storage import checkpoints, queries
from evora.storage.jobs import JobStore
from tests.conftest import Clock
from tests.dispatcher.conftest import Dispatcher
from tests.dispatcher.test_worker_api import claim, submit
from tests.polling import waits_for_a_lock


def _path(job_id: object) -> str:
    return f"/v1/jobs/{job_id}/checkpoints"


async def test_a_checkpoint_is_handed_to_the_next_attempt(
    dispatcher: Dispatcher, store: JobStore
) -> None:
    job_id = await submit(store, backoff={"initial_seconds": 0.001, "max_seconds": 0.001})
    [first] = await claim(dispatcher)
    assert first["checkpoints"] is None
    token = first["lease_token"]
    charged = {"charge": "ch_1", "amount": 1250}
    status, answer = await dispatcher.post(
        _path(job_id), {"lease_token": token, "name": "charged", "data": charged}
    )
    assert (status, answer) == (200, {"checkpoints": {"charged": charged}})
    status, answer = await dispatcher.post(
        _path(job_id), {"lease_token": token, "name": "emailed", "data": None}
    )
    assert answer == {"checkpoints": {"charged": charged, "emailed": None}}
    status, failed = await dispatcher.post(
        f"/v1/jobs/{job_id}/fail", {"lease_token": token, "error": {"message": "crashed"}}
    )
    assert (status, failed["state"]) == (200, "PENDING")
    assert failed["checkpoints"] == {"charged": charged, "emailed": None}

    [second] = await claim(dispatcher)
    assert (second["attempt"], second["checkpoints"]) == (2, {"charged": charged, "emailed": None})
    assert (await store.get(UUID(job_id)))["checkpoints"] == second["checkpoints"]
    events = await store.events(UUID(job_id))
    assert [(e["event"], e["from_state"], e["to_state"], e["data"]) for e in events[2:4]] == [
        ("checkpointed", "RUNNING", "RUNNING", {"name": "charged"}),
        ("checkpointed", "RUNNING", "RUNNING", {"name": "emailed"}),
    ]


async def test_a_stale_workers_checkpoint_is_refused_and_not_stored(
    dispatcher: Dispatcher, store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    job_id = await submit(store, lease_seconds=5)
    [stale] = await claim(dispatcher)
    await clock.advance(6)
    assert [j["id"] for j in await store.expire_leases()] == [UUID(job_id)]
    await clock.advance(3600)  # past the retry's backoff
    [owner] = await store.claim(worker_id="w2", queues=["q"])
    body = {"lease_token": stale["lease_token"], "name": "charged", "data": {"charge": "stale"}}
    status, problem = await dispatcher.post(_path(job_id), body)
    assert (status, problem["code"]) == (409, "lease_lost")
    assert (await store.get(UUID(job_id)))["checkpoints"] is None
    body = {"lease_token": str(owner["lease_token"]), "name": "charged", "data": 1}
    assert (await dispatcher.post(_path(job_id), body))[0] == 200
    assert (await dispatcher.post(_path(uuid4()), body))[0] == 404
    names = [e["event"] for e in await store.events(UUID(job_id))]
    assert names.count("checkpointed") == 1


async def test_checkpoints_are_bounded(dispatcher: Dispatcher, store: JobStore) -> None:
    job_id = await submit(store)
    [job] = await claim(dispatcher)
    token = job["lease_token"]
    for n in range(MAX_CHECKPOINTS):
        body = {"lease_token": token, "name": f"step-{n}", "data": n}
        assert (await dispatcher.post(_path(job_id), body))[0] == 200
    body = {"lease_token": token, "name": "one-more", "data": 0}
    status, problem = await dispatcher.post(_path(job_id), body)
    assert (status, problem["code"]) == (413, "payload_too_large")
    # replacing a name adds none
    assert (await dispatcher.post(_path(job_id), {**body, "name": "step-0"}))[0] == 200

    other_id = await submit(store, "big")
    [other] = await claim(dispatcher, ["big"])
    half = "x" * (MAX_CHECKPOINT_BYTES // 2)
    body = {"lease_token": other["lease_token"], "name": "a", "data": half}
    assert (await dispatcher.post(_path(other_id), body))[0] == 200
    status, problem = await dispatcher.post(_path(other_id), {**body, "name": "b"})
    assert (status, problem["code"]) == (413, "payload_too_large")
    assert list((await store.get(UUID(other_id)))["checkpoints"]) == ["a"]
    for name in ("", "has space", "x" * 256):
        status, problem = await dispatcher.post(_path(other_id), {**body, "name": name})
        assert (status, problem["code"]) == (422, "validation_error")


async def _held(db_url: str) -> asyncpg.Connection:
    """A connection of its own, opened after the clock moved, in a transaction the test
    ends."""
    conn = await asyncpg.connect(db_url)
    await conn.execute("BEGIN")
    return conn


async def test_two_checkpoints_at_once_keep_both(
    dispatcher: Dispatcher, store: JobStore, db_url: str
) -> None:
    """The second waits for the first's row lock and adds its name to the map the first
    committed, not to the one its snapshot showed."""
    job_id = UUID(await submit(store))
    [job] = await claim(dispatcher)
    first = await _held(db_url)
    try:
        [row] = await first.fetch(
            checkpoints.CHECKPOINT, job_id, UUID(job["lease_token"]), "a", "1", 100, 1 << 20
        )
        assert row["outcome"] == "done"
        second = asyncio.ensure_future(
            checkpoints.record(store.pool, job_id, UUID(job["lease_token"]), "b", 2)
        )
        await waits_for_a_lock(store.pool)
        assert not second.done()  # waiting for the row
        await first.execute("COMMIT")
    finally:
        await first.close()
    assert await second == {"a": 1, "b": 2}
    assert (await store.get(job_id))["checkpoints"] == {"a": 1, "b": 2}


async def test_a_checkpoint_waiting_for_the_lease_expiry_is_refused(
    dispatcher: Dispatcher, store: JobStore, clock: Clock, db_url: str
) -> None:
    job_id = UUID(await submit(store, lease_seconds=5))
    [job] = await claim(dispatcher)
    await clock.advance(6)
    sweep = await _held(db_url)
    try:
        assert len(await sweep.fetch(queries.EXPIRE_LEASES, 10, [])) == 1
        late = asyncio.ensure_future(
            checkpoints.record(store.pool, job_id, UUID(job["lease_token"]), "a", 1)
        )
        await waits_for_a_lock(store.pool)
        assert not late.done()
        await sweep.execute("COMMIT")
    finally:
        await sweep.close()
    with pytest.raises(LeaseLost):
        await late
    assert (await store.get(job_id))["checkpoints"] is None
