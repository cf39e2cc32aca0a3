"""pgqueuer: schema by `Queries.install()`, producer and worker in `pgqueuer_runner.py`
(its settings are described there), run by the cache venv's interpreter. No services."""

from __future__ import annotations

import asyncio
import subprocess
from contextlib import AsyncExitStack

import asyncpg

from bench.peers.peer import PeerSystem
from bench.wholelife import Counts, Part, vacuum

# pgqueuer's own statement for its worker's periodic task (`Queries.aggregate_logs`, every
# 30 s): it folds the log rows not yet aggregated into pgqueuer_statistics and marks them.
_AGGREGATE_LOGS = (
    "from pgqueuer.adapters.persistence.qb import QueryQueueBuilder; print(QueryQueueBuilder()"
    ".build_aggregate_log_data_to_statistics_query(advisory_lock=True))"
)


class PgqueuerSystem(PeerSystem):
    name = "pgqueuer"
    # Completed jobs are deleted from the queue table (and logged elsewhere).
    unfinished_sql = "SELECT EXISTS (SELECT FROM pgqueuer)"
    schemas = ("public",)

    def runner_argv(self) -> list[str]:
        return [str(self.peers.python), "-m", "bench.peers.pgqueuer_runner", "--dsn", self.dsn]

    async def deferred_parts(
        self, conn: asyncpg.Connection, dsn: str, stack: AsyncExitStack
    ) -> list[Part]:
        """What the worker's log aggregation has not done yet (it runs every 30 s, so the end
        of a run is usually left), then autovacuum's work. pgqueuer never deletes its log
        (pgqueuer_log, a row per job and status): an operator clears it (`clear_queue_log`,
        a TRUNCATE) when they choose; not measured here."""
        found = await asyncio.create_subprocess_exec(
            str(self.peers.python), "-c", _AGGREGATE_LOGS, stdout=subprocess.PIPE
        )
        statement = (await found.communicate())[0].decode()
        if found.returncode != 0:
            raise RuntimeError("pgqueuer's log aggregation statement not found")
        pending: int = await conn.fetchval("SELECT count(*) FROM pgqueuer_log WHERE NOT aggregated")

        async def aggregate() -> Counts:
            await conn.execute(statement)
            return {"log_rows": pending}

        return [Part("log aggregation", aggregate), vacuum(conn, self.schemas)]
