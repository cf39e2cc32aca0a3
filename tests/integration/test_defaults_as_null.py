"""A job's default backoff and on_dependency_failure are stored as NULL (migration 0067): what
is stored, what every reader makes of it (the job resource, a retry's wait, a dependency's
cancellation), and the upgrade from the release before, whose rows hold the defaults'
values and keep them."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from evora import sql_enqueue as sql
from evora.protocol.jobs import JobSubmission
from evora.storage.audit import audit
from evora.storage.db import create_pool
from evora.storage.jobs import Failure, JobStore
from evora.storage.migrate import apply_migrations
from tests.release_tree import CODE_ROOTS, run_release_script, schema_version, unpack_release

DEFAULT = {"initial_seconds": 1.0, "max_seconds": 3600.0, "multiplier": 2.0}
STORED = (
    "SELECT backoff_initial, backoff_max, backoff_multiplier, on_dependency_failure"
    " FROM evora.jobs WHERE id = $1"
)


def _sub(**fields: Any) -> JobSubmission:
    return JobSubmission.model_validate({"queue": "q", "type": "t", **fields})


async def _stored(pool: asyncpg.Pool, job_id: uuid.UUID) -> tuple[Any, ...]:
    return tuple(await pool.fetchrow(STORED, job_id))


async def test_defaults_are_stored_as_null_and_read_back_whole(
    store: JobStore, plain_conn: asyncpg.Connection
) -> None:
    dep = (await store.submit(_sub())).job["id"]
    backoffs: list[dict[str, float]] = [
        {},
        {"max_seconds": 10},
        dict(DEFAULT),  # named, and equal to the default: stored as NULL all the same
        {"initial_seconds": 2, "max_seconds": 20, "multiplier": 3},
    ]
    submitted = await store.submit_batch([_sub(backoff=b) for b in backoffs], with_jobs=False)
    over_http = [s.id for s in submitted]
    in_sql = [
        await sql.submit(plain_conn, "q", "t", backoff={"multiplier": 1.5}),
        await sql.submit(plain_conn, "q", "t", depends_on=[dep], on_dependency_failure="run"),
        await sql.submit(plain_conn, "q", "t", depends_on=[dep], on_dependency_failure="cancel"),
    ]
    pool = store.pool
    assert [await _stored(pool, i) for i in over_http] == [
        (None, None, None, None),
        (None, 10.0, None, None),
        (None, None, None, None),
        (2.0, 20.0, 3.0, None),
    ]
    assert [await _stored(pool, i) for i in in_sql] == [
        (None, None, 1.5, None),
        (None, None, None, "run"),
        (None, None, None, None),
    ]
    # the job resource says every field, whichever way it was stored
    assert [(await store.get(i))["backoff"] for i in over_http] == [
        DEFAULT,
        DEFAULT | {"max_seconds": 10.0},
        DEFAULT,
        {"initial_seconds": 2.0, "max_seconds": 20.0, "multiplier": 3.0},
    ]
    assert (await store.get(in_sql[0]))["backoff"] == DEFAULT | {"multiplier": 1.5}


async def test_a_null_field_of_a_retry_s_backoff_is_the_default(
    store: JobStore, plain_conn: asyncpg.Connection
) -> None:
    # every attempt's wait through NULL fields is that of the default's values, jittered
    # +-20 % and never above max_seconds
    waits = await plain_conn.fetch(
        "SELECT n, evora.backoff_seconds(NULL, NULL, NULL, n) AS through_null,"
        " evora.backoff_seconds(NULL, 5, NULL, n) AS capped"
        " FROM generate_series(1, 40) n, generate_series(1, 20)"
    )
    for w in waits:
        nominal = min(2.0 ** (w["n"] - 1), 3600.0)
        assert 0.8 * nominal <= w["through_null"] <= min(1.2 * nominal, 3600.0), dict(w)
        assert 0.8 * min(nominal, 5) <= w["capped"] <= 5.0, dict(w)
    # and a failed attempt is retried after it: initial 1 s (NULL), max 1.5 s
    job_id = (await store.submit(_sub(backoff={"max_seconds": 1.5}))).job["id"]
    assert await _stored(store.pool, job_id) == (None, 1.5, None, None)
    for attempt in (1, 2):
        [claimed] = await store.claim(worker_id="w", queues=["q"], max_jobs=1)
        assert claimed["id"] == job_id
        failed = await store.fail(Failure(job_id, claimed["lease_token"], "boom"))
        wait = (failed["run_at"] - failed["updated_at"]).total_seconds()
        nominal = min(2.0 ** (attempt - 1), 1.5)
        assert failed["state"] == "PENDING" and 0.8 * nominal <= wait <= nominal * 1.2, failed
        await plain_conn.execute(
            "UPDATE evora.jobs SET run_at = evora.clock_now() WHERE id = $1", job_id
        )


# main before migration 0067: its rows hold the defaults' values
BEFORE = 66
BEFORE_NULLS = "c1de9a6"

# Run by BEFORE_NULLS's own code: migrate an empty database, submit a job with the default
# backoff, one with its own, and a job waiting on each of two others under each
# on_dependency_failure; prints their ids.
_BEFORE_SCRIPT = """
import asyncio, json, sys
from evora.protocol.jobs import JobSubmission
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.migrate import apply_migrations

def sub(**fields):
    return JobSubmission.model_validate({"queue": "q", "type": "t", **fields})

async def main(url):
    await apply_migrations(url)
    pool = await create_pool(url, min_size=1, max_size=2)
    store = JobStore(pool)
    try:
        plain = (await store.submit(sub())).job["id"]
        own = (await store.submit(sub(backoff={"initial_seconds": 3, "max_seconds": 9}))).job["id"]
        dep = (await store.submit(sub(queue="deps"))).job["id"]
        cancels = (await store.submit(sub(depends_on=[dep]))).job["id"]
        runs = (await store.submit(sub(depends_on=[dep], on_dependency_failure="run"))).job["id"]
        print(json.dumps({k: str(v) for k, v in
                          dict(plain=plain, own=own, dep=dep, cancels=cancels, runs=runs).items()}))
    finally:
        await store.close()
        await pool.close()

asyncio.run(main(sys.argv[1]))
"""


async def test_rows_written_before_keep_their_values_and_read_alike(
    empty_db_url: str, tmp_path: Path
) -> None:
    tree = unpack_release(BEFORE_NULLS, tmp_path / "before", CODE_ROOTS)
    before = {
        k: uuid.UUID(v)
        for k, v in (await run_release_script(tree, _BEFORE_SCRIPT, empty_db_url)).items()
    }
    assert await schema_version(empty_db_url) == BEFORE
    assert 67 in await apply_migrations(empty_db_url)

    pool = await create_pool(empty_db_url, min_size=1, max_size=4)
    store = JobStore(pool)
    try:
        # nothing was rewritten: the rows of before hold the values they were stored with
        assert await _stored(pool, before["plain"]) == (1.0, 3600.0, 2.0, "cancel")
        assert await _stored(pool, before["own"]) == (3.0, 9.0, 2.0, "cancel")
        assert await _stored(pool, before["runs"]) == (1.0, 3600.0, 2.0, "run")
        after = {
            "plain": (await store.submit(_sub())).job["id"],
            "cancels": (await store.submit(_sub(depends_on=[before["dep"]]))).job["id"],
        }
        assert await _stored(pool, after["plain"]) == (None, None, None, None)
        assert await _stored(pool, after["cancels"]) == (None, None, None, None)
        # one resource whichever way the default was stored
        assert (await store.get(before["plain"]))["backoff"] == DEFAULT
        assert (await store.get(after["plain"]))["backoff"] == DEFAULT
        assert (await store.get(before["own"]))["backoff"] == {
            "initial_seconds": 3.0,
            "max_seconds": 9.0,
            "multiplier": 2.0,
        }
        # the dependency cancelled: the 'cancel' of before and the NULL of after both cancel,
        # 'run' releases
        assert (await store.cancel(before["dep"])).immediate
        states = {
            name: (await store.get(job_id))["state"]
            for name, job_id in (
                ("before cancels", before["cancels"]),
                ("after cancels", after["cancels"]),
                ("before runs", before["runs"]),
            )
        }
        assert states == {
            "before cancels": "CANCELLED",
            "after cancels": "CANCELLED",
            "before runs": "PENDING",
        }
        # a retry of a row of before waits its stored backoff
        while True:
            [claimed] = await store.claim(worker_id="w", queues=["q"], max_jobs=1)
            if claimed["id"] == before["own"]:
                break
            await store.complete(claimed["id"], claimed["lease_token"])
        failed = await store.fail(Failure(before["own"], claimed["lease_token"], "boom"))
        wait = (failed["run_at"] - failed["updated_at"]).total_seconds()
        assert failed["state"] == "PENDING" and 0.8 * 3 <= wait <= 1.2 * 3, failed
        async with pool.acquire() as conn:
            report = await audit(conn)
        assert report.ok, report.text()
    finally:
        await store.close()
        await pool.close()


@pytest.mark.parametrize("column", ["backoff_initial", "on_dependency_failure"])
async def test_the_checks_still_refuse_what_no_default_is(
    plain_conn: asyncpg.Connection, column: str
) -> None:
    # NULL passes the column's CHECK; a value it forbids still does not
    job_id = await sql.submit(plain_conn, "q", "t")
    bad = {"backoff_initial": "0", "on_dependency_failure": "'later'"}[column]
    with pytest.raises(asyncpg.CheckViolationError):
        await plain_conn.execute(f"UPDATE evora.jobs SET {column} = {bad} WHERE id = $1", job_id)
