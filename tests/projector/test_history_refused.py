"""A PostgreSQL that will not tell the projector its history (system identifier, timeline:
HistoryChanged). Managed services and forks refuse the functions it is read with: a
hardening policy's `REVOKE EXECUTE ... FROM PUBLIC`, Aurora's "currently not supported"
(feature_not_supported) or, on its writer, "wal_level must be set to 'logical'"
(object_not_in_prerequisite_state). The read models must keep flowing without the check,
say once that it is off, and never rebuild because a history appeared or went missing.

The refusals are made for real on the test's own database, as a non-superuser login role:
a REVOKE of a pg_catalog function holds only in the database it is run in (pg_proc is per
database), so it does not reach the tests running beside this one. Aurora's errors come from
functions of the same names that the role finds first on its search_path."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from pymongo.asynchronous.database import AsyncDatabase

from evora.http.metrics import ServiceMetrics
from evora.readmodels.layout import CONTROL, Document, checkpoint_id
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.outbox import Batch, HistoryChanged, read_batch
from evora_services.projector import projector as projector_module
from evora_services.projector.history_check import HistoryCheck
from evora_services.projector.metrics import ProjectorMetrics
from evora_services.projector.projector import Projector
from evora_services.projector.service import ProjectorService
from tests.polling import until
from tests.projector.conftest import catch_up
from tests.projector.test_projection import assert_matches_truth
from tests.projector.workload import mixed_workload

QUEUES = ["alpha", "beta"]
CHECK_OFF = "evora_projector_history_check_off"

# What the superuser runs in the test's database to make it refuse `role` its history.
REFUSALS = {
    "pg_control_system revoked": "REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC",
    "pg_walfile_name revoked": "REVOKE EXECUTE ON FUNCTION pg_walfile_name(pg_lsn) FROM PUBLIC",
    "Aurora: not supported": """
        CREATE SCHEMA fork;
        GRANT USAGE ON SCHEMA fork TO {role};
        CREATE FUNCTION fork.pg_current_wal_insert_lsn() RETURNS pg_lsn LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'Function pg_current_wal_insert_lsn() is currently not supported'
                ' for Aurora' USING ERRCODE = 'feature_not_supported';
        END $$;
        ALTER ROLE {role} SET search_path = fork, pg_catalog""",
    "Aurora writer: wal_level": """
        CREATE SCHEMA fork;
        GRANT USAGE ON SCHEMA fork TO {role};
        CREATE FUNCTION fork.pg_control_system(OUT pg_control_version int4,
            OUT system_identifier int8) LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'wal_level must be set to ''logical''' USING
                ERRCODE = 'object_not_in_prerequisite_state',
                HINT = 'WAL control functions cannot be executed when wal_level < logical.';
        END $$;
        ALTER ROLE {role} SET search_path = fork, pg_catalog""",
}
REASONS = {
    "pg_control_system revoked": "permission denied for function pg_control_system",
    "pg_walfile_name revoked": "permission denied for function pg_walfile_name",
    "Aurora: not supported": "is currently not supported for Aurora",
    "Aurora writer: wal_level": "wal_level must be set to 'logical'",
}


class Role:
    """A login role of the test's own, granted what the projector uses of `evora`."""

    def __init__(self, name: str, dsn: str) -> None:
        self.name = name
        self.dsn = dsn

    @contextlib.asynccontextmanager
    async def pool(self) -> AsyncIterator[asyncpg.Pool]:
        """A pool of its sessions, which take the role's settings as they are now."""
        pool = await create_pool(self.dsn, min_size=1, max_size=4)
        try:
            yield pool
        finally:
            await pool.close()


@pytest.fixture
async def role(db_url: str, plain_conn: asyncpg.Connection) -> AsyncIterator[Role]:
    name = f"projector_{uuid.uuid4().hex[:12]}"
    await plain_conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'projector-password'")
    await plain_conn.execute(
        f"GRANT USAGE ON SCHEMA evora TO {name};"
        f" GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA evora TO {name};"
        f" GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA evora TO {name};"
        f" GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA evora TO {name}"
    )
    parts = urlsplit(db_url)
    netloc = f"{name}:projector-password@{parts.hostname}:{parts.port}"
    try:
        yield Role(name, urlunsplit(parts._replace(netloc=netloc)))
    finally:
        # roles belong to the whole server: gone with the test
        await plain_conn.execute(f"DROP OWNED BY {name}; DROP ROLE {name}")


@pytest.fixture
async def role_pool(role: Role) -> AsyncIterator[asyncpg.Pool]:
    async with role.pool() as pool:
        yield pool


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each read_batch of the projector asked for the history, in order."""
    asked: list[bool] = []

    async def spy(*args: Any, **kwargs: Any) -> Batch | None:
        asked.append(kwargs.get("read_history", True))
        return await read_batch(*args, **kwargs)

    monkeypatch.setattr(projector_module, "read_batch", spy)
    return asked


async def _history(mongo: AsyncDatabase[Document]) -> Any:
    checkpoint = await mongo[CONTROL].find_one({"_id": checkpoint_id(1)})
    assert checkpoint is not None
    return checkpoint["history"]


@pytest.mark.parametrize("refusal", list(REFUSALS))
async def test_a_server_that_refuses_the_history_is_read_on_without_it(
    refusal: str,
    store: JobStore,
    pool: asyncpg.Pool,
    plain_conn: asyncpg.Connection,
    role: Role,
    mongo: AsyncDatabase[Document],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await plain_conn.execute(REFUSALS[refusal].format(role=role.name))
    await mixed_workload(store, pool, jobs=40, queues=QUEUES, seed=31)
    base = ServiceMetrics("projector")
    asked = _reads(monkeypatch)
    async with role.pool() as role_pool:
        projector = Projector(role_pool, mongo, 1, ProjectorMetrics(base), batch_size=15)
        await catch_up(projector)
        await mixed_workload(store, pool, jobs=20, queues=QUEUES, seed=32)
        await catch_up(projector)

    await assert_matches_truth(pool, mongo)
    assert await _history(mongo) is None  # not known, rather than made up
    assert base.registry.get_sample_value(CHECK_OFF) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert REASONS[refusal] in warnings[0] and "evora projector --rebuild" in warnings[0]
    # asked once, not with every batch (until HistoryCheck's retry is due)
    assert len(asked) > 6 and asked.count(True) == 1 and asked[0], asked


async def test_the_history_check_off_and_on_again_rebuilds_only_on_another_history(
    store: JobStore,
    pool: asyncpg.Pool,
    plain_conn: asyncpg.Connection,
    role: Role,
    role_pool: asyncpg.Pool,
    mongo: AsyncDatabase[Document],
) -> None:
    """A checkpoint without a history (the check off) followed by one with it (the grant
    given back), or the reverse, is no change of history: no rebuild. One taken off keeps the
    last history known, so a change the projector could not see while the check was off (the
    stored one made another timeline, as if a failover had happened meanwhile) is found as
    soon as it is on again."""
    system, timeline = await pool.fetchrow(
        "SELECT (pg_control_system()).system_identifier::text,"
        " left(pg_walfile_name(pg_current_wal_insert_lsn()), 8)"
    )
    here, elsewhere = f"{system}/{timeline}", f"{system}/{int(timeline, 16) + 1:08X}"
    revoke = "REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC"
    give_back = f"GRANT EXECUTE ON FUNCTION pg_control_system() TO {role.name}"
    take_away = f"REVOKE EXECUTE ON FUNCTION pg_control_system() FROM {role.name}"
    base = ServiceMetrics("projector")
    metrics = ProjectorMetrics(base)
    # tried again with every batch while off, so each grant or revoke is seen at once
    check = HistoryCheck(metrics, retry_seconds=0)
    seed = iter(range(40, 50))

    def projector() -> Projector:  # afresh, reading the checkpoint as stored
        return Projector(role_pool, mongo, 1, metrics, batch_size=15, history_check=check)

    async def more_and_catch_up() -> None:
        await mixed_workload(store, pool, jobs=20, queues=QUEUES, seed=next(seed))
        await catch_up(projector())

    await plain_conn.execute(revoke)
    await more_and_catch_up()
    assert (await _history(mongo), base.registry.get_sample_value(CHECK_OFF)) == (None, 1)

    await plain_conn.execute(give_back)  # None, then a history: recorded, nothing rebuilt
    await more_and_catch_up()
    assert (await _history(mongo), base.registry.get_sample_value(CHECK_OFF)) == (here, 0)

    await plain_conn.execute(take_away)  # a history, then none: kept, nothing rebuilt
    await more_and_catch_up()
    assert (await _history(mongo), base.registry.get_sample_value(CHECK_OFF)) == (here, 1)
    await plain_conn.execute(give_back)  # and the same one again
    await more_and_catch_up()
    assert (await _history(mongo), base.registry.get_sample_value(CHECK_OFF)) == (here, 0)
    await assert_matches_truth(pool, mongo)

    await plain_conn.execute(take_away)
    await mongo[CONTROL].update_one({"_id": checkpoint_id(1)}, {"$set": {"history": elsewhere}})
    await more_and_catch_up()  # unseen while off
    assert await _history(mongo) == elsewhere
    await plain_conn.execute(give_back)
    await mixed_workload(store, pool, jobs=5, queues=QUEUES, seed=next(seed))
    with pytest.raises(HistoryChanged) as raised:
        await projector().run_once()
    assert (raised.value.stored, raised.value.found) == (elsewhere, here)


async def test_the_service_keeps_the_read_models_flowing_and_says_so_once(
    store: JobStore,
    pool: asyncpg.Pool,
    plain_conn: asyncpg.Connection,
    role_pool: asyncpg.Pool,
    mongo: AsyncDatabase[Document],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The service as deployed, its loop reading batch after batch without the history: the
    read models keep up with later work too, the gauge it exports reads 1, one WARNING."""
    await plain_conn.execute(REFUSALS["pg_control_system revoked"])
    base = ServiceMetrics("projector")
    service = ProjectorService(role_pool, mongo, ProjectorMetrics(base))

    async def matches() -> bool:
        try:
            await assert_matches_truth(pool, mongo)
        except AssertionError:
            return False
        return True

    ended = asyncio.Event()
    leading = asyncio.create_task(service.lead(ended))
    try:
        for seed in (51, 52, 53):
            await mixed_workload(store, pool, jobs=30, queues=QUEUES, seed=seed)
            await until(matches, "the read models equal the tables", within=30)
    finally:
        ended.set()
        await asyncio.wait_for(leading, 30)
    assert base.registry.get_sample_value(CHECK_OFF) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and REASONS["pg_control_system revoked"] in warnings[0], warnings
