"""POST /v1/jobs/{id}/children (docs/jobs-that-wait.md, "Children awaited without holding a
slot"): a running job submits its children and waits for them WAITING, holding no lease and
no limit slot, its attempt uncounted; its next claim carries their results. The lease token
fences it; a requested cancel wins; a stale or refused request stores nothing."""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import orjson
import pytest

from evora.protocol.bounds import MAX_CHILDREN
from evora.protocol.jobs import JobSubmission
from evora.protocol.worker import ChildrenResponse
from evora.storage.jobs import JobStore
from evora.storage.limits import LimitSpec, LimitStore
from tests.dispatcher.conftest import Dispatcher
from tests.dispatcher.test_worker_api import claim, submit

KIDS = "kids"

# A claim that finds nothing waits up to `wait_seconds=10` below: a job the dependency
# settlement just made PENDING reaches the dispatcher as a NOTIFY hint, after its commit.


def kids(count: int, **fields: Any) -> list[dict[str, Any]]:
    return [{"queue": KIDS, "type": "child", "payload": {"n": n}, **fields} for n in range(count)]


async def spawn(
    dispatcher: Dispatcher, job: dict[str, Any], children: list[dict[str, Any]], **fields: Any
) -> tuple[int, Any]:
    return await dispatcher.post(
        f"/v1/jobs/{job['id']}/children",
        {"lease_token": job["lease_token"], "jobs": children, **fields},
    )


async def complete(dispatcher: Dispatcher, job: dict[str, Any], result: Any) -> None:
    status, answer = await dispatcher.post(
        f"/v1/jobs/{job['id']}/complete", {"lease_token": job["lease_token"], "result": result}
    )
    assert status == 200, answer


async def count_in(pool: asyncpg.Pool, queue: str) -> int:
    counted: int = await pool.fetchval("SELECT count(*) FROM evora.jobs WHERE queue = $1", queue)
    return counted


async def test_a_parent_waits_for_its_children_and_its_next_run_sees_their_results(
    dispatcher: Dispatcher, store: JobStore
) -> None:
    parent_id = await submit(store, max_attempts=1)
    [parent] = await claim(dispatcher)
    status, answer = await spawn(dispatcher, parent, kids(3))
    assert status == 200, answer
    ChildrenResponse.model_validate(answer)
    held = answer["job"]
    # off the worker, its attempt handed back: a job with one attempt may still wait
    assert (held["state"], held["lease_expires_at"], held["attempt"]) == ("WAITING", None, 0)
    children = [child["id"] for child in answer["children"]]
    assert [child["status"] for child in answer["children"]] == [201] * 3
    assert held["depends_on"] == children
    # its token fences nothing any more, and it is not claimable while the children run
    body = {"lease_token": parent["lease_token"]}
    assert (await dispatcher.post(f"/v1/jobs/{parent_id}/heartbeat", body))[0] == 409
    assert await claim(dispatcher) == []
    running = await claim(dispatcher, [KIDS], max_jobs=10)
    assert sorted(child["id"] for child in running) == sorted(children)
    for child in running:
        await complete(dispatcher, child, {"done": child["payload"]["n"]})
        if child is not running[-1]:
            assert (await store.get(UUID(parent_id)))["state"] == "WAITING"
    [again] = await claim(dispatcher, wait_seconds=10)
    assert again["id"] == parent_id
    assert again["attempt"] == 1  # the same attempt number: waiting used up none
    assert again["dependency_results"] == {
        child["id"]: {"done": child["payload"]["n"]} for child in running
    }
    await complete(dispatcher, again, "all done")
    events = [e["event"] for e in await store.events(again["id"])]
    assert events == [
        "submitted",
        "claimed",
        "awaiting_children",
        "dependencies_met",
        "claimed",
        "completed",
    ]


@pytest.mark.parametrize("on_failure", ["cancel", "run"])
async def test_a_cancelled_child_cancels_or_releases_its_parent(
    dispatcher: Dispatcher, store: JobStore, on_failure: str
) -> None:
    parent_id = await submit(store)
    [parent] = await claim(dispatcher)
    status, answer = await spawn(dispatcher, parent, kids(2), on_dependency_failure=on_failure)
    assert status == 200, answer
    assert on_failure == await store.pool.fetchval(
        # (NULL is 'cancel': migration 0067)
        "SELECT coalesce(on_dependency_failure, 'cancel') FROM evora.jobs WHERE id = $1",
        parent["id"],
    )
    first, second = answer["children"]
    [child] = await claim(dispatcher, [KIDS], max_jobs=1)
    await complete(dispatcher, child, "ok")
    other = second if child["id"] == first["id"] else first
    assert (await store.cancel(other["id"])).immediate
    now = await store.get(UUID(parent_id))
    if on_failure == "cancel":
        assert now["state"] == "CANCELLED"
        assert await claim(dispatcher) == []
    else:
        [again] = await claim(dispatcher, wait_seconds=10)
        assert again["dependency_results"] == {child["id"]: "ok"}


async def test_a_stale_lease_spawns_nothing(dispatcher: Dispatcher, store: JobStore) -> None:
    parent_id = await submit(store)
    [parent] = await claim(dispatcher)
    stale = {**parent, "lease_token": str(uuid4())}
    assert (await spawn(dispatcher, stale, kids(2)))[0] == 409
    assert (await spawn(dispatcher, {**parent, "id": str(uuid4())}, kids(2)))[0] == 404
    assert await count_in(store.pool, KIDS) == 0
    assert (await store.get(UUID(parent_id)))["state"] == "RUNNING"
    # once the attempt moved, its token is stale too: a repeat spawns nothing more
    assert (await spawn(dispatcher, parent, kids(1)))[0] == 200
    assert (await spawn(dispatcher, parent, kids(1)))[0] == 409
    assert await count_in(store.pool, KIDS) == 1


async def test_a_refused_child_stores_nothing(dispatcher: Dispatcher, store: JobStore) -> None:
    parent_id = await submit(store)
    [parent] = await claim(dispatcher)
    # a child that waits for its parent would wait for ever, as the parent for it
    children = [*kids(1), {"queue": KIDS, "type": "child", "depends_on": [parent_id]}]
    status, problem = await spawn(dispatcher, parent, children)
    assert status == 422, problem
    assert "jobs[1].depends_on[0]" in problem["detail"]
    # so is a batch's own refusal: a dependency on no job
    children = [*kids(1), {"queue": KIDS, "type": "child", "depends_on": [str(uuid4())]}]
    assert (await spawn(dispatcher, parent, children))[0] == 422
    assert (await spawn(dispatcher, parent, []))[0] == 422
    assert (await spawn(dispatcher, parent, kids(MAX_CHILDREN + 1)))[0] == 422
    assert await count_in(store.pool, KIDS) == 0
    assert (await store.get(UUID(parent_id)))["state"] == "RUNNING"


async def test_a_requested_cancel_wins_and_spawns_nothing(
    dispatcher: Dispatcher, store: JobStore
) -> None:
    await submit(store)
    [parent] = await claim(dispatcher)
    assert not (await store.cancel(parent["id"])).immediate
    status, answer = await spawn(dispatcher, parent, kids(2))
    assert (status, answer["job"]["state"], answer["children"]) == (200, "CANCELLED", [])
    assert await count_in(store.pool, KIDS) == 0


async def test_a_waiting_parent_holds_no_limit_slot(
    dispatcher: Dispatcher, store: JobStore, pool: asyncpg.Pool
) -> None:
    """Parent and children share a key of concurrency 1: were the waiting parent still
    counted, no child could ever run."""
    await LimitStore(pool).put("tenant:a", LimitSpec(concurrency=1, rate=None))
    await submit(store, limit_keys=["tenant:a"])
    [parent] = await claim(dispatcher)
    status, answer = await spawn(dispatcher, parent, kids(2, limit_keys=["tenant:a"]))
    assert status == 200, answer
    for _ in range(2):
        # one at a time (the limit); a claim that found the key full waits for the wake-up
        [child] = await claim(dispatcher, [KIDS], max_jobs=2, wait_seconds=10)
        await complete(dispatcher, child, None)
    [again] = await claim(dispatcher, wait_seconds=10)
    assert again["id"] == parent["id"]


async def test_a_fan_out_of_ten_thousand_children_resumes_the_parent_once(
    dispatcher: Dispatcher, store: JobStore
) -> None:
    parent_id = await submit(store)
    [parent] = await claim(dispatcher)
    started = time.perf_counter()
    status, answer = await spawn(dispatcher, parent, kids(MAX_CHILDREN))
    print(f"\n{MAX_CHILDREN} children submitted in {time.perf_counter() - started:.2f} s")
    assert status == 200, answer
    assert len(answer["children"]) == MAX_CHILDREN
    assert answer["job"]["state"] == "WAITING"
    started = time.perf_counter()
    done = 0
    while jobs := await store.claim(worker_id="w", queues=[KIDS], max_jobs=500):
        await store.settle_completions(
            [j["id"] for j in jobs],
            [j["lease_token"] for j in jobs],
            [orjson.Fragment(b"1")] * len(jobs),
        )
        done += len(jobs)
        if done < MAX_CHILDREN:
            assert (await store.get(UUID(parent_id)))["state"] == "WAITING"
    print(f"{done} children completed in {time.perf_counter() - started:.2f} s")
    assert done == MAX_CHILDREN
    started = time.perf_counter()
    [again] = await claim(dispatcher, wait_seconds=10)
    print(f"the parent claimed with their results in {time.perf_counter() - started:.2f} s")
    assert len(again["dependency_results"]) == MAX_CHILDREN
    events = [e["event"] for e in await store.events(UUID(parent_id))]
    assert events.count("dependencies_met") == 1
    assert events[-3:] == ["awaiting_children", "dependencies_met", "claimed"]


async def test_children_named_by_replayed_keys_count_as_ended(
    dispatcher: Dispatcher, store: JobStore
) -> None:
    done = (await store.submit(JobSubmission(queue=KIDS, type="c", idempotency_key="a"))).job
    [child] = await store.claim(worker_id="w", queues=[KIDS])
    await store.complete(child["id"], child["lease_token"], "earlier")
    parent_id = await submit(store)
    [parent] = await claim(dispatcher)
    status, answer = await spawn(
        dispatcher, parent, [{"queue": KIDS, "type": "c", "idempotency_key": "a"}]
    )
    assert status == 200, answer
    assert answer["children"] == [{"id": str(done["id"]), "status": 200}]
    # nothing left to wait for: PENDING at once, the attempt handed back
    assert (answer["job"]["state"], answer["job"]["attempt"]) == ("PENDING", 0)
    [again] = await claim(dispatcher, wait_seconds=10)
    assert (again["id"], again["dependency_results"]) == (parent_id, {str(done["id"]): "earlier"})


async def test_a_child_already_cancelled_is_refused_under_cancel(
    dispatcher: Dispatcher, store: JobStore
) -> None:
    """As a submission naming a CANCELLED dependency under "cancel": the job could never run."""
    gone = (await store.submit(JobSubmission(queue=KIDS, type="c", idempotency_key="x"))).job
    assert (await store.cancel(gone["id"])).immediate
    parent_id = await submit(store)
    [parent] = await claim(dispatcher)
    children = [*kids(1), {"queue": KIDS, "type": "c", "idempotency_key": "x"}]
    status, problem = await spawn(dispatcher, parent, children)
    assert status == 422, problem
    assert f"jobs[1]: 'x' names the CANCELLED job {gone['id']}" in problem["detail"]
    assert await count_in(store.pool, KIDS) == 1  # the cancelled one only
    assert (await store.get(UUID(parent_id)))["state"] == "RUNNING"
    # under "run" it is one child less to wait for
    status, answer = await spawn(dispatcher, parent, children, on_dependency_failure="run")
    assert status == 200, answer
    assert answer["job"]["state"] == "WAITING"
    left = "SELECT dependencies_left FROM evora.jobs WHERE id = $1"
    assert await store.pool.fetchval(left, UUID(parent_id)) == 1


async def test_a_waiting_parent_does_not_keep_its_groups_turn(
    dispatcher: Dispatcher, store: JobStore
) -> None:
    """The group's next jobs, its children among them, run while the parent waits (were the
    turn kept, its children of the group never could); resumed, the parent is its group's
    head again, before a job submitted after it."""
    await submit(store, group_key="g")
    later = await submit(store, group_key="g")
    [parent] = await claim(dispatcher)
    status, answer = await spawn(
        dispatcher, parent, [{"queue": "q", "type": "c", "group_key": "g"}]
    )
    assert status == 200, answer
    [turn] = await claim(dispatcher, max_jobs=5)
    assert turn["id"] == later
    await complete(dispatcher, turn, None)
    [child] = await claim(dispatcher, max_jobs=5, wait_seconds=10)
    assert child["id"] == answer["children"][0]["id"]
    last = await submit(store, group_key="g")
    await complete(dispatcher, child, None)
    [again] = await claim(dispatcher, max_jobs=5, wait_seconds=10)
    assert again["id"] == parent["id"]
    await complete(dispatcher, again, None)
    [after] = await claim(dispatcher, wait_seconds=10)
    assert after["id"] == last
