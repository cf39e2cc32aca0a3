"""Concurrent single POST /v1/jobs requests are coalesced into one statement (evora.coalesce),
yet each is answered as if it had been sent alone: its `ref:` names are its own, its errors
are its own, and it waits on its own locks only, never on one another request ran into.

The coalesced cases drive the app's own coalescer, so that the requests surely share a
statement; the HTTP cases race real requests (which may or may not share one)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import orjson
from aiohttp import ClientResponse

from evora.domain.errors import EvoraError, IdempotencyConflict, InvalidDependency
from evora.protocol.jobs import JobSubmission
from evora.storage.submissions import Submitted
from evora_services.api.routes import SUBMITS
from tests.api.conftest import PRODUCER, ApiClient, job
from tests.polling import until

QUEUE = "emails"


def submission(**fields: Any) -> JobSubmission:
    return JobSubmission.model_validate(job(**fields))


async def coalesced(client: ApiClient, *subs: JobSubmission) -> list[Submitted | EvoraError]:
    """Submit through the app's coalescer all at once: they reach it in the same turn of the
    event loop, so they go out in one statement."""
    return await asyncio.gather(*(client.app[SUBMITS].submit((s, None)) for s in subs))


async def test_coalesced_requests_each_have_their_own_ref_names(
    client: ApiClient, db: asyncpg.Connection
) -> None:
    named, named_too, plain, naming = await coalesced(
        client,
        submission(ref="x", payload={"producer": 1}),
        submission(ref="x", payload={"producer": 2}),
        submission(payload={"producer": 3}),
        # A single request has no earlier item: another request's ref is not its to name.
        submission(depends_on=["ref:x"], payload={"producer": 4}),
    )
    for outcome in (named, named_too, plain):
        assert isinstance(outcome, Submitted) and outcome.created
        assert outcome.job["state"] == "PENDING"
    assert isinstance(naming, InvalidDependency)
    assert str(naming).startswith("depends_on[0]: 'ref:x' names no earlier item")
    assert await db.fetchval("SELECT count(*) FROM evora.jobs") == 3
    assert await db.fetchval("SELECT count(*) FROM evora.job_dependencies") == 0


async def test_coalesced_requests_are_each_answered_their_own_outcome(
    client: ApiClient, db: asyncpg.Connection
) -> None:
    first, conflicting, repeated, bad_ref, good = await coalesced(
        client,
        submission(idempotency_key="k", ref="a", payload=1),
        submission(idempotency_key="k", payload=2),
        submission(idempotency_key="k", ref="a", payload=1),
        submission(depends_on=["ref:a"]),
        submission(payload="good"),
    )
    assert isinstance(first, Submitted) and first.created
    assert isinstance(conflicting, IdempotencyConflict)
    assert isinstance(repeated, Submitted) and not repeated.created
    assert repeated.id == first.id
    assert isinstance(bad_ref, InvalidDependency)
    assert isinstance(good, Submitted) and good.created
    stored = {r["id"] for r in await db.fetch("SELECT id FROM evora.jobs")}
    assert stored == {first.id, good.id}


async def test_a_ref_conflicting_request_leaves_no_dependent_on_a_job_that_never_was(
    client: ApiClient, db: asyncpg.Connection
) -> None:
    await coalesced(client, submission(idempotency_key="taken", payload=1))
    conflicting, dependent = await coalesced(
        client,
        submission(idempotency_key="taken", ref="a", payload=2),
        submission(depends_on=["ref:a"]),
    )
    assert isinstance(conflicting, IdempotencyConflict)
    assert isinstance(dependent, InvalidDependency)
    assert await db.fetchval("SELECT count(*) FROM evora.jobs WHERE state = 'WAITING'") == 0


async def post(client: ApiClient, body: dict[str, Any]) -> ClientResponse:
    return await client.post("/v1/jobs", json=body, headers=PRODUCER)


async def test_racing_producers_never_share_ref_names(
    client: ApiClient, db: asyncpg.Connection
) -> None:
    for round in range(10):
        responses = await asyncio.gather(
            post(client, job(ref="x", payload={"round": round, "producer": 1})),
            post(client, job(ref="x", payload={"round": round, "producer": 2})),
            post(client, job(payload={"round": round, "producer": 3})),
            post(client, job(depends_on=["ref:x"], payload={"round": round, "producer": 4})),
        )
        assert [r.status for r in responses] == [201, 201, 201, 422], [
            await r.text() for r in responses
        ]
    assert await db.fetchval("SELECT count(*) FROM evora.jobs") == 30
    assert await db.fetchval("SELECT count(*) FROM evora.job_dependencies") == 0


async def waiting_on_a_lock(db: asyncpg.Connection) -> bool:
    waiting: int = await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND datname = current_database()"
    )
    return waiting > 0


async def test_a_key_held_by_an_open_sql_transaction_stalls_only_its_own_request(
    client: ApiClient, db: asyncpg.Connection, db_url: str
) -> None:
    app = await asyncpg.connect(db_url)
    try:
        held = app.transaction()
        await held.start()
        # An application submits in SQL with key K and keeps its transaction open.
        await app.fetchval(
            "SELECT evora.submit($1, 'email.send', '{\"sql\": true}', $2::jsonb)",
            QUEUE,
            orjson.dumps({"idempotency_key": "K"}).decode(),
        )
        contended = asyncio.create_task(post(client, job(idempotency_key="K", payload="http")))
        # Sent together with K's request: they may share its statement.
        beside = [asyncio.create_task(post(client, job(payload=i))) for i in range(5)]
        await until(lambda: waiting_on_a_lock(db), "K's request waits for the held key")
        # Sent while K's request waits: they come after it.
        behind = [asyncio.create_task(post(client, job(payload=i))) for i in range(5, 10)]
        unrelated = await asyncio.gather(*beside, *behind)

        assert [r.status for r in unrelated] == [201] * 10, [await r.text() for r in unrelated]
        assert not contended.done()
        await held.commit()
    finally:
        await app.close()
    # K's request is answered once the transaction ends: the key now holds other fields.
    response = await contended
    assert response.status == 409, await response.text()
    assert await db.fetchval("SELECT count(*) FROM evora.jobs") == 11
