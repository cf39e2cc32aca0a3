"""The limit endpoints and `limit_keys` on submissions, on the real api app and a real
PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from evora.storage import limits
from evora.storage.jobs import JobStore
from evora.storage.limits import WAKE_READ
from tests.api.conftest import ADMIN, PRODUCER, ApiClient, problem

CONCURRENCY = {"concurrency": 2, "rate": None}


async def put(
    client: ApiClient, key: str, body: dict[str, Any], status: int = 201
) -> dict[str, Any]:
    response = await client.put(f"/v1/limits/{key}", json=body, headers=ADMIN)
    assert response.status == status, await response.text()
    limit: dict[str, Any] = await response.json()
    return limit


async def test_create_replace_list_read_delete(client: ApiClient) -> None:
    created = await put(client, "tenant:*", CONCURRENCY)
    assert (created["key"], created["concurrency"], created["rate"]) == ("tenant:*", 2, None)
    rate = {"limit": 10, "per_seconds": 1.5}
    replaced = await put(client, "tenant:*", {"concurrency": None, "rate": rate}, 200)
    assert (replaced["concurrency"], replaced["rate"]) == (None, rate)
    assert replaced["created_at"] == created["created_at"]

    for key in ("api:stripe", f"queue:{'q' * 128}"):
        await put(client, key, CONCURRENCY)
    response = await client.get("/v1/limits", params={"limit": "2"}, headers=ADMIN)
    page = await response.json()
    assert [limit["key"] for limit in page["limits"]] == ["api:stripe", f"queue:{'q' * 128}"]
    response = await client.get(
        "/v1/limits", params={"limit": "2", "after": page["next"]}, headers=ADMIN
    )
    last = await response.json()
    assert [limit["key"] for limit in last["limits"]] == ["tenant:*"] and last["next"] is None

    response = await client.get("/v1/limits/tenant:42", headers=ADMIN)
    usage = await response.json()
    assert usage == {
        **replaced,
        "key": "tenant:42",
        "governed_by": "tenant:*",
        "running": 0,
        "tokens": 10,
        "throttled_jobs": 0,
        "throttled_since": None,
        "throttled_until": None,  # no upstream's retry-after drains it
        "pending": None,  # no max_pending
        "room": None,
    }

    response = await client.delete("/v1/limits/tenant:*", headers=ADMIN)
    assert response.status == 204
    for path in ("/v1/limits/tenant:42", "/v1/limits/tenant:*"):
        await problem(await client.get(path, headers=ADMIN), 404, "limit_not_found")
    await problem(await client.delete("/v1/limits/tenant:*", headers=ADMIN), 404, "limit_not_found")


async def test_usage_counts_running_and_throttled_jobs(client: ApiClient, store: JobStore) -> None:
    await put(client, "tenant:*", {"concurrency": 1, "rate": None})
    for _ in range(3):
        response = await client.post(
            "/v1/jobs",
            json={"queue": "q", "type": "t", "limit_keys": ["tenant:7", "api:x"]},
            headers=PRODUCER,
        )
        assert response.status == 201
        assert (await response.json())["limit_keys"] == ["tenant:7", "api:x"]
    [claimed] = await store.claim(worker_id="w", queues=["q"], max_jobs=10)
    usage = await (await client.get("/v1/limits/tenant:7", headers=ADMIN)).json()
    assert (usage["running"], usage["throttled_jobs"], usage["tokens"]) == (1, 2, None)
    await store.complete(claimed["id"], claimed["lease_token"])
    usage = await (await client.get("/v1/limits/tenant:7", headers=ADMIN)).json()
    assert (usage["running"], usage["throttled_jobs"]) == (0, 0)


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"concurrency": 0, "rate": None}, ["concurrency"]),
        ({"concurrency": None, "rate": {"limit": 0, "per_seconds": 1}}, ["rate", "limit"]),
        ({"concurrency": None, "rate": {"limit": 1, "per_seconds": 0}}, ["rate", "per_seconds"]),
        ({"concurrency": "3", "rate": None}, ["concurrency"]),
        ({"rate": None}, ["concurrency"]),
        ({"concurrency": 1, "rate": None, "burst": 2}, ["burst"]),
    ],
)
async def test_invalid_limits_are_422(
    client: ApiClient, body: dict[str, Any], loc: list[Any]
) -> None:
    response = await client.put("/v1/limits/k", json=body, headers=ADMIN)
    found = await problem(response, 422, "validation_error")
    assert loc in [e["loc"] for e in found["errors"]]


@pytest.mark.parametrize("key", ["*", "a*b", "-a", "a" * 256, "tenant:**", "t%20x"])
async def test_a_key_no_limit_can_have_is_422_to_put_and_404_to_read(
    client: ApiClient, key: str
) -> None:
    response = await client.put(f"/v1/limits/{key}", json=CONCURRENCY, headers=ADMIN)
    await problem(response, 422, "validation_error")
    await problem(await client.get(f"/v1/limits/{key}", headers=ADMIN), 404, "limit_not_found")


async def test_a_bad_cursor_is_422(client: ApiClient) -> None:
    response = await client.get("/v1/limits", params={"after": "nope"}, headers=ADMIN)
    await problem(response, 422, "validation_error")


async def test_limits_are_for_admins(client: ApiClient) -> None:
    response = await client.put("/v1/limits/k", json=CONCURRENCY, headers=PRODUCER)
    await problem(response, 403, "forbidden")


@pytest.mark.parametrize(
    ("keys", "where"),
    [
        (["a"] * 2, ["limit_keys"]),
        ([f"k{n}" for n in range(9)], ["limit_keys"]),
        (["bad key"], ["limit_keys", 0]),
        (["x" * 256], ["limit_keys", 0]),
        (["tenant:*"], ["limit_keys", 0]),
        ("tenant:1", ["limit_keys"]),
    ],
)
async def test_invalid_limit_keys_are_422_in_single_and_batch(
    client: ApiClient, keys: Any, where: list[Any]
) -> None:
    job = {"queue": "q", "type": "t", "limit_keys": keys}
    found = await problem(
        await client.post("/v1/jobs", json=job, headers=PRODUCER), 422, "validation_error"
    )
    assert [e["loc"][: len(where)] for e in found["errors"]] == [where]
    response = await client.post("/v1/jobs/batch", json={"jobs": [job]}, headers=PRODUCER)
    found = await problem(response, 422, "validation_error")
    assert [e["loc"][: 2 + len(where)] for e in found["errors"]] == [["jobs", 0, *where]]


async def test_limit_keys_are_part_of_the_idempotent_identity(client: ApiClient) -> None:
    job = {"queue": "q", "type": "t", "idempotency_key": "k", "limit_keys": ["a", "b"]}
    first = await client.post("/v1/jobs", json=job, headers=PRODUCER)
    assert first.status == 201
    again = await client.post("/v1/jobs", json=job, headers=PRODUCER)
    assert again.status == 200
    other = await client.post("/v1/jobs", json={**job, "limit_keys": ["b", "a"]}, headers=PRODUCER)
    await problem(other, 409, "idempotency_conflict")
    batch = await client.post("/v1/jobs/batch", json={"jobs": [job]}, headers=PRODUCER)
    assert (await batch.json())["jobs"][0]["status"] == 200


async def submit(client: ApiClient, queue: str, *keys: str, count: int = 1) -> None:
    for _ in range(count):
        job = {"queue": queue, "type": "t", "limit_keys": list(keys)}
        response = await client.post("/v1/jobs", json=job, headers=PRODUCER)
        assert response.status == 201, await response.text()


async def usage_of(client: ApiClient, key: str) -> dict[str, Any]:
    response = await client.get(f"/v1/limits/{key}", headers=ADMIN)
    assert response.status == 200, await response.text()
    found: dict[str, Any] = await response.json()
    return found


async def test_a_prefix_limit_sums_only_the_keys_it_governs(
    client: ApiClient, store: JobStore
) -> None:
    await put(client, "tenant:*", {"concurrency": 1, "rate": None})
    # keys under tenant: governed by limits of their own, not by tenant:*
    await put(client, "tenant:vip", {"concurrency": 5, "rate": None})
    await put(client, "tenant:eu:*", {"concurrency": 2, "rate": None})
    await submit(client, "q", "tenant:1", count=2)
    await submit(client, "q", "tenant:vip", count=3)
    await submit(client, "q", "tenant:eu:1", count=3)
    claimed = await store.claim(worker_id="w", queues=["q"], max_jobs=20)
    assert len(claimed) == 1 + 3 + 2

    prefix = await usage_of(client, "tenant:*")
    # tenant:1 alone: 1 running, 1 held back; tenant:vip and tenant:eu:1 are not its keys
    assert (prefix["running"], prefix["throttled_jobs"], prefix["tokens"]) == (1, 1, None)
    assert prefix["throttled_since"] is not None
    eu = await usage_of(client, "tenant:eu:*")
    assert (eu["governed_by"], eu["running"], eu["throttled_jobs"]) == ("tenant:eu:*", 2, 1)
    vip = await usage_of(client, "tenant:vip")
    assert (vip["running"], vip["throttled_jobs"], vip["throttled_since"]) == (3, 0, None)
    # a prefix limit's key names that limit only, never a shorter prefix limit
    await problem(await client.get("/v1/limits/tenant:e*", headers=ADMIN), 404, "limit_not_found")


async def test_the_keys_a_prefix_limit_governs_come_a_page_at_a_time(
    client: ApiClient, store: JobStore
) -> None:
    rate = {"limit": 100, "per_seconds": 60}
    await put(client, "tenant:*", {"concurrency": 2, "rate": rate})
    await put(client, "tenant:own", CONCURRENCY)
    for tenant in ("a", "b", "c", "own"):
        await submit(client, "q", f"tenant:{tenant}", count=3 if tenant == "b" else 1)
    claimed = await store.claim(worker_id="w", queues=["q"], max_jobs=20)
    assert len(claimed) == 5  # tenant:b holds one back

    seen: list[dict[str, Any]] = []
    after = None
    while True:
        params = {"limit": "2"} | ({"after": after} if after else {})
        response = await client.get("/v1/limits/tenant:*/keys", params=params, headers=ADMIN)
        assert response.status == 200, await response.text()
        page = await response.json()
        assert page["limit"]["key"] == "tenant:*" and page["limit"]["concurrency"] == 2
        assert len(page["keys"]) <= 2
        seen += page["keys"]
        if page["next"] is None:
            break
        after = page["next"]
    assert [k["key"] for k in seen] == ["tenant:a", "tenant:b", "tenant:c"]
    b = seen[1]
    assert (b["running"], int(b["tokens"]), b["throttled_jobs"]) == (2, 98, 1)
    assert b["throttled_since"] is not None
    assert (seen[0]["running"], seen[0]["throttled_jobs"], int(seen[0]["tokens"])) == (1, 0, 99)

    response = await client.get("/v1/limits/tenant:own/keys", headers=ADMIN)
    own = await response.json()
    assert [(k["key"], k["running"]) for k in own["keys"]] == [("tenant:own", 1)]
    assert own["next"] is None
    response = await client.get("/v1/limits/tenant:zz/keys", headers=ADMIN)
    assert [k["key"] for k in (await response.json())["keys"]] == ["tenant:zz"]
    await problem(await client.get("/v1/limits/nope/keys", headers=ADMIN), 404, "limit_not_found")


@pytest.mark.parametrize(
    ("change", "key", "queues", "read"),
    [
        ("put", "api:x", ["held"], WAKE_READ),
        # a prefix limit wakes every queue with PENDING jobs (no index finds keys by prefix)
        ("put", "api:*", ["held", "other", "plain"], WAKE_READ),
        ("put", "queue:held", ["held"], WAKE_READ),
        ("delete", "api:x", ["held"], WAKE_READ),
        # more jobs naming the key than a wake-up reads: every queue with PENDING jobs
        ("put", "api:x", ["held", "other", "plain"], 1),
    ],
)
async def test_a_limit_change_wakes_the_queues_whose_jobs_it_may_hold_back(
    client: ApiClient,
    db_url: str,
    change: str,
    key: str,
    queues: list[str],
    read: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "WAKE_READ", read)
    await put(client, "api:x", {"concurrency": 1, "rate": None})
    await submit(client, "held", "api:x", count=2)
    await submit(client, "other", "api:y")
    await submit(client, "plain", count=1)
    hints: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(db_url)
    try:
        await listener.add_listener("evora_jobs", lambda *args: hints.put_nowait(args[3]))
        if change == "put":
            await put(
                client, key, {"concurrency": 3, "rate": None}, status=200 if key == "api:x" else 201
            )
        else:
            response = await client.delete(f"/v1/limits/{key}", headers=ADMIN)
            assert response.status == 204
        woken = [await asyncio.wait_for(hints.get(), 5)]
        await asyncio.sleep(0.2)  # anything else would have come with it
        while not hints.empty():
            woken.append(hints.get_nowait())
    finally:
        await listener.close()
    assert sorted(woken) == queues
