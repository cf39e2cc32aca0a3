"""The projector never reads the outbox of a standby without PostgreSQL's history.

A standby refuses to tell its history for as long as it is one ("recovery is in progress",
object_not_in_prerequisite_state), and refuses it a role the primary revoked it from as the
primary does (the REVOKE is replicated). Where the refusal comes from a fork or a hardening
policy, the projector reads on without the history (tests/projector/test_history_refused.py);
on a standby it must not: a standby replays the primary's commits late (here 500 ms, as
tests/e2e/test_read_replica.py holds it back), so a span target taken on the primary counts
finished transactions whose events it does not hold yet, and a batch read there would pass
over them for good. So the refusal is raised there, the checkpoint stays as it was and the
check stays on."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from pymongo.asynchronous.database import AsyncDatabase

from evora.embedded import LocalPostgres
from evora.readmodels.layout import CONTROL, Document, checkpoint_id
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora_services.projector.history_check import HistoryCheck
from evora_services.projector.projector import Projector
from tests.e2e.clusters import cluster_dir
from tests.e2e.test_read_replica import _primary_and_standby
from tests.polling import until
from tests.projector.workload import mixed_workload

QUEUES = ["alpha", "beta"]
ROLE = "history_refused"


def _as_role(server: LocalPostgres) -> str:
    parts = urlsplit(server.dsn())
    return urlunsplit(parts._replace(netloc=f"{ROLE}:role-password@{parts.hostname}:{parts.port}"))


async def _role_replayed(standby: LocalPostgres) -> bool:
    try:
        conn = await asyncpg.connect(_as_role(standby))
    except asyncpg.InvalidAuthorizationSpecificationError:
        return False
    try:
        return not await conn.fetchval(
            "SELECT has_function_privilege('pg_control_system()', 'EXECUTE')"
        )
    finally:
        await conn.close()


async def test_a_standby_is_never_read_without_the_history(
    mongo: AsyncDatabase[Document],
) -> None:
    with cluster_dir("evora-test-standby-history-") as tmp:
        async with _primary_and_standby(tmp) as (primary, standby):
            conn = await asyncpg.connect(primary.dsn())
            try:
                await conn.execute(
                    f"CREATE ROLE {ROLE} LOGIN PASSWORD 'role-password';"
                    f" GRANT USAGE ON SCHEMA evora TO {ROLE};"
                    f" GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA evora TO {ROLE};"
                    f" GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA evora TO {ROLE};"
                    " REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC"
                )
            finally:
                await conn.close()
            on_primary = await create_pool(primary.dsn(), min_size=1, max_size=4)
            store = JobStore(on_primary)
            try:
                await mixed_workload(store, on_primary, jobs=40, queues=QUEUES, seed=21)
                # a span's target stored and part of it read, on the primary
                await Projector(on_primary, mongo, 1, batch_size=10).run_once()
            finally:
                await store.close()
                await on_primary.close()
            stored = await mongo[CONTROL].find_one({"_id": checkpoint_id(1)})
            assert stored is not None and stored["target"] is not None and stored["history"]
            await until(lambda: _role_replayed(standby), "the standby has the role", within=30)

            refusals = [
                (standby.dsn(), asyncpg.ObjectNotInPrerequisiteStateError),
                (_as_role(standby), asyncpg.InsufficientPrivilegeError),
            ]
            for dsn, refusal in refusals:
                on_standby = await create_pool(dsn, min_size=1, max_size=2)
                check = HistoryCheck()
                try:
                    with pytest.raises(refusal):
                        await Projector(
                            on_standby, mongo, 1, batch_size=10, history_check=check
                        ).run_once()
                finally:
                    await on_standby.close()
                assert check.refused is None
                assert await mongo[CONTROL].find_one({"_id": checkpoint_id(1)}) == stored
