"""Outcomes carried by `POST /v1/claim` (its `acks` field), against a real dispatcher and
PostgreSQL (docs/http-api.md#post-v1claim): settled like `POST /v1/acks`, while the claim
runs, and the claim answers what it would have found after them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from uuid import UUID, uuid4

import asyncpg

from evora.storage.jobs import JobStore
from tests.dispatcher.conftest import Dispatcher
from tests.dispatcher.test_worker_api import claim, submit
from tests.polling import until


def complete(job: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    return {"id": job["id"], "lease_token": token or job["lease_token"], "outcome": "complete"}


async def claim_with(d: Dispatcher, acks: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    body = {"worker_id": "w1", "queues": ["q"], "wait_seconds": 0, "acks": acks, **fields}
    status, answer = await d.post("/v1/claim", body)
    assert status == 200, answer
    assert isinstance(answer, dict)
    return answer


async def test_each_carried_outcome_is_answered_beside_the_claimed_jobs(
    dispatcher: Dispatcher, store: JobStore
) -> None:
    for _ in range(4):
        await submit(store, max_attempts=1)
    a, b, c = await claim(dispatcher, max_jobs=3)
    unknown = {"id": str(uuid4()), "lease_token": str(uuid4()), "outcome": "complete"}
    failure = {**complete(b), "outcome": "fail", "error": {"message": "x", "retryable": False}}
    acks = [complete(a), complete(c, str(uuid4())), unknown, failure, complete(a)]
    answer = await claim_with(dispatcher, acks, max_jobs=5)
    assert answer["results"] == [
        {"id": a["id"], "status": 200},
        {"id": c["id"], "status": 409},  # a stale token changes nothing
        {"id": unknown["id"], "status": 404},
        {"id": b["id"], "status": 200},
        {"id": a["id"], "status": 200},  # the owner repeating itself
    ]
    assert len(answer["jobs"]) == 1  # the fourth job, beside the answers
    states = {x["id"]: (await store.get(UUID(x["id"])))["state"] for x in (a, b, c)}
    assert states == {a["id"]: "COMPLETED", b["id"]: "DLQ", c["id"]: "RUNNING"}
    # A claim without outcomes is answered as before: no `results`.
    assert await claim_with(dispatcher, []) == {"jobs": [], "results": []}
    status, plain = await dispatcher.post(
        "/v1/claim", {"worker_id": "w1", "queues": ["q"], "wait_seconds": 0}
    )
    assert (status, plain) == (200, {"jobs": []})


async def test_outcomes_are_settled_before_the_claim_so_it_sees_freed_group_slots(
    dispatcher: Dispatcher, store: JobStore
) -> None:
    first = await submit(store, group_key="g")
    second = await submit(store, group_key="g")
    [job] = await claim(dispatcher, max_jobs=10)
    assert job["id"] == first
    # The group's one slot is taken: a plain claim finds nothing...
    assert await claim(dispatcher, max_jobs=10) == []
    # ...and the claim carrying the first job's outcome gets the second job.
    answer = await claim_with(dispatcher, [complete(job)], max_jobs=10)
    assert answer["results"] == [{"id": first, "status": 200}]
    assert [j["id"] for j in answer["jobs"]] == [second]


@asynccontextmanager
async def row_locked(db_url: str, job_id: str) -> AsyncIterator[None]:
    """Hold `job_id`'s row lock from another session, so whatever settles it waits."""
    conn = await asyncpg.connect(db_url)
    try:
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM evora.jobs WHERE id = $1 FOR UPDATE", UUID(job_id))
            yield
    finally:
        await conn.close()


async def has_state(store: JobStore, job_id: str, state: str) -> bool:
    job = await store.get(UUID(job_id))
    return bool(job["state"] == state)


@asynccontextmanager
async def settle_held(
    dispatcher: Dispatcher,
    store: JobStore,
    db_url: str,
    job: dict[str, Any],
    taken: str,
    **fields: Any,
) -> AsyncIterator[asyncio.Future[dict[str, Any]]]:
    """A claim carrying `job`'s completion, sent while `job`'s row is locked so that its
    settle waits; entered once that claim has taken `taken` (committed: RUNNING), which
    proves the claim ran while the settle was held. The lock goes on exit."""
    async with row_locked(db_url, job["id"]):
        answering = asyncio.ensure_future(claim_with(dispatcher, [complete(job)], **fields))
        await until(lambda: has_state(store, taken, "RUNNING"), f"the claim took {taken}")
        yield answering


async def test_the_claim_runs_while_its_outcomes_are_settled(
    dispatcher: Dispatcher, store: JobStore, db_url: str
) -> None:
    """The settle and the claim are two statements at once: with the settle held up by a
    row lock, the next job is already claimed (and committed) before the settle ends. Each
    answer then holds both: the outcome's status and the job."""
    first = await submit(store)
    [job] = await claim(dispatcher)
    second = await submit(store)
    async with settle_held(dispatcher, store, db_url, job, second) as answering:
        assert await has_state(store, first, "RUNNING")  # the settle still waits
        assert not answering.done()  # and the answer waits for it
    answer = await answering
    assert answer["results"] == [{"id": first, "status": 200}]
    assert [j["id"] for j in answer["jobs"]] == [second]
    assert await has_state(store, first, "COMPLETED")


async def test_a_short_claim_runs_again_for_the_slots_its_outcomes_free(
    dispatcher: Dispatcher, store: JobStore, db_url: str
) -> None:
    """The first claim ran while the group's first job was still RUNNING (its completion held
    by a row lock), so it found only the ungrouped job; once the completion is recorded the
    claim runs again and the answer also holds the group's next job."""
    first = await submit(store, group_key="g")
    [job] = await claim(dispatcher)
    second = await submit(store, group_key="g")
    loose = await submit(store)
    async with settle_held(dispatcher, store, db_url, job, loose, max_jobs=5) as answering:
        assert await has_state(store, second, "PENDING")
    answer = await answering
    assert answer["results"] == [{"id": first, "status": 200}]
    assert [j["id"] for j in answer["jobs"]] == [loose, second]


async def test_a_worker_leaving_while_its_outcomes_settle_strands_nothing(
    dispatcher: Dispatcher, store: JobStore, db_url: str
) -> None:
    """The worker disconnects after the claim took a job but before the settle ended: the
    job goes back to the queue at once, and the outcomes are still recorded."""
    first = await submit(store)
    [job] = await claim(dispatcher)
    second = await submit(store)
    async with settle_held(dispatcher, store, db_url, job, second) as answering:
        answering.cancel()  # the client closes its connection
        await until(
            lambda: has_state(store, second, "PENDING"),
            "the undelivered job went back to the queue",
        )
    await until(lambda: has_state(store, first, "COMPLETED"), "the carried outcome was recorded")


async def test_a_claims_acks_racing_a_strangers_are_fenced_per_item(
    dispatcher: Dispatcher, store: JobStore
) -> None:
    """The owner's claim carries the right tokens, a stranger (whose tokens are stale) sends
    its outcomes for the same jobs at the same time, both by `/v1/acks` and in its own claim:
    the owner wins every item, the stranger is answered 409 for each, in any interleaving."""
    for round_ in range(5):
        for _ in range(6):
            await submit(store, max_attempts=1)
        jobs = await claim(dispatcher, max_jobs=6)
        assert len(jobs) == 6, round_
        owner = [complete(j) for j in jobs]
        stranger = [complete(j, str(uuid4())) for j in jobs]
        mine, theirs, theirs_in_claim = await asyncio.gather(
            claim_with(dispatcher, owner, max_jobs=1),
            dispatcher.post("/v1/acks", {"acks": stranger}),
            claim_with(dispatcher, stranger[::-1], max_jobs=1),
        )
        ids = [j["id"] for j in jobs]
        assert mine["results"] == [{"id": i, "status": 200} for i in ids]
        assert theirs == (200, {"results": [{"id": i, "status": 409} for i in ids]})
        assert theirs_in_claim["results"] == [{"id": i, "status": 409} for i in ids[::-1]]
        for i in ids:
            assert (await store.get(UUID(i)))["state"] == "COMPLETED"


async def test_a_bad_carried_outcome_is_a_problem_like_in_acks(dispatcher: Dispatcher) -> None:
    job = {"id": str(uuid4()), "lease_token": str(uuid4())}
    status, problem = await dispatcher.post(
        "/v1/claim",
        {"worker_id": "w1", "queues": ["q"], "acks": [{**job, "outcome": "fail"}]},
    )
    assert status == 422
    assert problem["code"] == "validation_error"
