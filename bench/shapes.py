"""Which storage shape can meet issue #33's per-job targets: candidate shapes side by side at
store level, each a job's whole life (submit, drain, vacuum, retention, vacuum).

Not a test, and nothing here is production code: the prototypes are plain SQL (the constants
below), each in a schema of its own, beside Evora's real schema (the migrations of the `evora`
package on the path) in one database of one PostgreSQL 18 cluster (`LocalPostgres`, durable:
fsync, synchronous_commit, full-page writes and the data checksums initdb gives), autovacuum
off so that no vacuum falls unseen into a measured phase. Per round, Evora's clock runs a day
ahead (`evora.clock_offset`: the round's jobs live in day partitions of their own), and each
shape in turn, the rounds interleaved shape by shape, goes through:

- `submit`: `CHECKPOINT`, then `--jobs` jobs submitted in batches of 1,000;
- `drain`: `CHECKPOINT`, then one worker claims `--batch` jobs with FOR UPDATE SKIP LOCKED and
  completes the batch (fenced by the lease token where the shape has one), until none is left;
- `vacuum`: `VACUUM (ANALYZE false)` of every table of the shape (what autovacuum does soon);
- `retention`: `CHECKPOINT` (retention comes a day later), then what removes the round's jobs
  and their history as the shape would (row deletes, or day partitions counted, detached
  concurrently and dropped);
- `vacuum 2`: the same vacuum again.

With `--no-checkpoints`, no CHECKPOINT before a phase (the lower bound of the full-page
images: a drain close behind its submissions, within one checkpoint cycle). Each phase: WAL
bytes (the insert position, exact), of them the full-page images' (pg_walinspect), the
client backends' CPU (user + system from /proc, 10 ms ticks) and the whole cluster's (every
PostgreSQL process), per job; the last round's WAL by relation (each record counted once,
whole, for the relation of its first block; partitions named by their parent).
Medians over `--rounds`.

The shapes (`--shapes`):

- `graphile`: graphile-worker 0.18's `_private_jobs` (its table and indexes as its migrations
  leave them), its `add_jobs` insert, its batch claim (`UPDATE ... locked_at, locked_by` of
  the rows a `FOR UPDATE SKIP LOCKED` select picked) and its batch completion (a DELETE by id,
  which checks no lock owner for jobs without a named queue): the calibration;
- `today`: Evora as it is (`JobStore.submit_batch`, `.claim`, `.complete_many`; retention by
  `evora.prune_finished()` and the day's partitions of the outbox detached and dropped, the
  rows' and their twin of `evora.event_batches`). Since migration 0064 its submissions,
  claims and completions write their events one row of `evora.event_batches` per statement:
  the shape `today-batch` measured that as a prototype (the three functions rewritten to
  write batches), and `today` is now what it measured;
- `split`: the job record written once at submission (day partitions by submission time); a
  narrow `ready` table the claim deletes from; a narrow `running` table the claim inserts into
  and the fenced completion deletes from (the FIFO group's unique index lives there); finished
  jobs inserted into day partitions of `finished`; events as Evora wrote them before
  migration 0064 (a row per transition, `(job_id, job_version, at)` unique and the
  `(xid, seq)` tail, BRIN on seq), carrying the due and start times the projector reads
  instead of the copy of the job; retention counts and drops the day's partitions of all
  three;
- `split-batch`: `split` with one outbox row per statement (arrays of ids, versions, states,
  queues, types, due and start times; one tail entry per statement), the timeline by job id
  from the read models (no index by job id);
- `split-batch-gin`: the same with a GIN index on the ids array for the timeline by id;
- `split-batch-lean`: `split-batch` without the index of leases by expiry (the sweeper reads
  `running`, which holds only the jobs in flight, whole).

    python -m bench.shapes --rounds 7 --jobs 10000 [--no-checkpoints]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from bench import procstats
from bench.drain_pg import QUEUE, drain, submit
from bench.finished_partitions import fpi_bytes, on_fresh_cluster, wal
from bench.wholelife import tables
from evora.embedded import LocalPostgres
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.migrate import apply_migrations
from evora.storage.submissions import uuid7s

SHAPES = (
    "graphile",
    "today",
    "split",
    "split-batch",
    "split-batch-gin",
    "split-batch-lean",
)
# The shape that runs Evora's own functions (through JobStore).
EVORA_SHAPE = "today"
# One database holds Evora's schema and every prototype's.
DATABASE = "shapes"
# The outbox's partitioned tables: the events written one by one, and the batches (one row
# per statement, migration 0064).
EVENT_TABLES = {"evora.job_event_rows", "evora.event_batches"}
PHASES = ("submit", "drain", "vacuum", "retention", "vacuum 2")
SUBMIT_BATCH = 1000
WORKER = "shapes-worker"

# graphile-worker 0.18: the jobs table and its indexes as migrations 000001-000020 leave them
# (000011's table, renamed `_private_jobs` by 000016; row level security and the job queues'
# table play no part in jobs without a named queue). One task, `noop`.
GRAPHILE_SCHEMA = """
CREATE SCHEMA graphile;
CREATE TABLE graphile._private_tasks (
    id int PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    identifier text NOT NULL UNIQUE CHECK (length(identifier) <= 128)
);
INSERT INTO graphile._private_tasks (identifier) VALUES ('noop');
CREATE TABLE graphile._private_jobs (
    id bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    job_queue_id int NULL,
    task_id int NOT NULL,
    payload json DEFAULT '{}'::json NOT NULL,
    priority smallint DEFAULT 0 NOT NULL,
    run_at timestamptz DEFAULT now() NOT NULL,
    attempts smallint DEFAULT 0 NOT NULL,
    max_attempts smallint DEFAULT 25 NOT NULL CHECK (max_attempts >= 1),
    last_error text,
    created_at timestamptz DEFAULT now() NOT NULL,
    updated_at timestamptz DEFAULT now() NOT NULL,
    key text UNIQUE CHECK (length(key) > 0 AND length(key) <= 512),
    locked_at timestamptz,
    locked_by text,
    revision integer DEFAULT 0 NOT NULL,
    flags jsonb,
    is_available boolean GENERATED ALWAYS AS (((locked_at IS NULL) AND (attempts < max_attempts)))
        STORED NOT NULL
);
CREATE INDEX jobs_main_index ON graphile._private_jobs USING btree (priority, run_at)
    INCLUDE (id, task_id, job_queue_id) WHERE (is_available = true);
CREATE INDEX jobs_no_queue_index ON graphile._private_jobs USING btree (priority, run_at)
    INCLUDE (id, task_id) WHERE (is_available = true AND job_queue_id IS NULL);
"""
# add_jobs()' insert for specs without a key, queue, run_at or flags (what the peer benchmark's
# producer sends), and its notification.
GRAPHILE_SUBMIT = """
WITH added AS (
    INSERT INTO graphile._private_jobs (job_queue_id, task_id, payload, run_at, max_attempts,
                                        key, priority, flags)
    SELECT NULL, t.id, p.payload, now(), 25, NULL, 0, NULL
    FROM unnest($1::json[]) AS p(payload)
    JOIN graphile._private_tasks t ON t.identifier = 'noop'
    RETURNING id
)
SELECT count(*), pg_notify('jobs:insert', '{"count":' || count(*) || '}') FROM added
"""
# getJobs.js for a batch (batchSize > 1), no named queues, no flags.
GRAPHILE_CLAIM = """
WITH j_raw AS (
    SELECT jobs.job_queue_id, jobs.priority, jobs.run_at, jobs.id
    FROM graphile._private_jobs AS jobs
    WHERE jobs.is_available = true AND run_at <= now() AND task_id = any($2::int[])
      AND jobs.job_queue_id IS NULL
    ORDER BY priority ASC, run_at ASC
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), j AS (
    SELECT DISTINCT ON (job_queue_id, CASE WHEN job_queue_id IS NULL THEN id END)
        job_queue_id, priority, run_at, id
    FROM j_raw
    ORDER BY job_queue_id, CASE WHEN job_queue_id IS NULL THEN id END, priority ASC, run_at ASC
)
UPDATE graphile._private_jobs AS jobs
SET attempts = jobs.attempts + 1, locked_by = $1::text, locked_at = now()
FROM j WHERE jobs.id = j.id
RETURNING *
"""
# completeJobs.js for jobs without a named queue.
GRAPHILE_COMPLETE = """
DELETE FROM graphile._private_jobs AS jobs USING unnest($1::bigint[]) n(n) WHERE id = n
"""

# The split shapes. `{s}` is the schema. Partitioned tables get their day partitions (and a
# primary key on id in each, since a unique index across partitions must hold the partition
# key) from `day_partitions`; no default partition (it would forbid DETACH ... CONCURRENTLY).
SPLIT_SCHEMA = """
CREATE SCHEMA {s};
-- The job as submitted: written once, read by id, never updated on the hot path.
CREATE TABLE {s}.jobs (
    id uuid NOT NULL,
    queue text NOT NULL,
    type text NOT NULL,
    payload jsonb NOT NULL,
    priority integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL DEFAULT 3,
    group_key text,
    created_at timestamptz NOT NULL
) PARTITION BY RANGE (created_at);
-- What a claim needs to choose, and nothing else.
CREATE TABLE {s}.ready (
    id uuid PRIMARY KEY,
    queue text NOT NULL,
    type text NOT NULL,
    priority integer NOT NULL,
    run_at timestamptz NOT NULL,
    seq bigint NOT NULL,
    attempt integer NOT NULL
);
CREATE SEQUENCE {s}.submit_seq;
CREATE INDEX ready_claim ON {s}.ready (queue, priority DESC, seq);
-- A lease: the fencing token, the expiry the sweeper reads, the FIFO group's one runner.
CREATE TABLE {s}.running (
    id uuid PRIMARY KEY,
    token uuid NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    worker text NOT NULL,
    queue text NOT NULL,
    type text NOT NULL,
    group_key text,
    attempt integer NOT NULL,
    started_at timestamptz NOT NULL
);
CREATE INDEX running_lease ON {s}.running (lease_expires_at);
CREATE UNIQUE INDEX running_group ON {s}.running (queue, group_key) WHERE group_key IS NOT NULL;
CREATE TABLE {s}.finished (
    id uuid NOT NULL,
    state evora.job_state NOT NULL,
    result jsonb,
    finished_at timestamptz NOT NULL
) PARTITION BY RANGE (finished_at);
CREATE TABLE {s}.prune_counts (
    queue text NOT NULL,
    state evora.job_state NOT NULL,
    pruned bigint NOT NULL,
    PRIMARY KEY (queue, state)
);
"""
SPLIT_EVENTS = """
CREATE TABLE {s}.events (
    seq bigint GENERATED ALWAYS AS IDENTITY,
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    job_id uuid NOT NULL,
    job_version integer NOT NULL,
    queue text NOT NULL,
    type text NOT NULL,
    event text NOT NULL,
    from_state evora.job_state,
    to_state evora.job_state NOT NULL,
    attempt integer NOT NULL,
    worker_id text,
    at timestamptz NOT NULL,
    run_at timestamptz,
    started_at timestamptz,
    data jsonb NOT NULL DEFAULT '{}',
    UNIQUE (job_id, job_version, at)
) PARTITION BY RANGE (at);
CREATE INDEX events_tail ON {s}.events (xid, seq);
CREATE INDEX events_seq ON {s}.events USING brin (seq);
"""
# One row per statement: the jobs it moved as arrays (a job's version is 1 when submitted,
# 2 * attempt when claimed, 2 * attempt + 1 when it ends), with what the projector reads of
# each (its queue, type, due and start times).
BATCH_EVENTS = """
CREATE TABLE {s}.events (
    seq bigint GENERATED ALWAYS AS IDENTITY,
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    event text NOT NULL,
    worker_id text,
    at timestamptz NOT NULL,
    job_ids uuid[] NOT NULL,
    versions integer[] NOT NULL,
    states evora.job_state[] NOT NULL,
    queues text[] NOT NULL,
    types text[] NOT NULL,
    run_ats timestamptz[],
    started_ats timestamptz[],
    data jsonb NOT NULL DEFAULT '{}'
) PARTITION BY RANGE (at);
CREATE INDEX events_tail ON {s}.events (xid, seq);
CREATE INDEX events_seq ON {s}.events USING brin (seq);
"""
GIN_TIMELINE = "CREATE INDEX events_job_ids ON {s}.events USING gin (job_ids);"
# The sweeper's expiry scan reads `running` whole instead: it holds only the jobs in flight.
NO_LEASE_INDEX = "DROP INDEX {s}.running_lease;"

SPLIT_SUBMIT = """
WITH input AS (
    SELECT i.id, i.payload::jsonb AS payload, nextval('{s}.submit_seq') AS seq
    FROM unnest($1::uuid[], $2::text[]) AS i(id, payload)
), job AS (
    INSERT INTO {s}.jobs (id, queue, type, payload, created_at)
    SELECT id, $3, $4, payload, evora.clock_now() FROM input
), ready AS (
    INSERT INTO {s}.ready (id, queue, type, priority, run_at, seq, attempt)
    SELECT id, $3, $4, 0, evora.clock_now(), seq, 0 FROM input
){events}
SELECT count(*) FROM input
"""
SPLIT_CLAIM = """
WITH picked AS (
    DELETE FROM {s}.ready r
    WHERE r.id IN (SELECT c.id FROM {s}.ready c
                   WHERE c.queue = $1 AND c.run_at <= evora.clock_now()
                   ORDER BY c.priority DESC, c.seq LIMIT $2 FOR UPDATE SKIP LOCKED)
    RETURNING r.id, r.queue, r.type, r.attempt + 1 AS attempt, r.run_at
), ran AS (
    INSERT INTO {s}.running (id, token, lease_expires_at, worker, queue, type, group_key, attempt,
                             started_at)
    SELECT p.id, gen_random_uuid(), evora.clock_now() + interval '5 minutes', $3, p.queue,
           p.type, NULL, p.attempt, evora.clock_now()
    FROM picked p
    RETURNING id, token, queue, type, attempt, started_at
){events}
SELECT r.id, r.token, r.attempt, j.type, j.payload
FROM ran r JOIN {s}.jobs j ON j.id = r.id
"""
SPLIT_COMPLETE = """
WITH done AS (
    DELETE FROM {s}.running r USING unnest($1::uuid[], $2::uuid[]) AS i(id, token)
    WHERE r.id = i.id AND r.token = i.token
    RETURNING r.id, r.queue, r.type, r.attempt, r.worker, r.started_at
), fin AS (
    INSERT INTO {s}.finished (id, state, result, finished_at)
    SELECT id, 'COMPLETED', NULL, evora.clock_now() FROM done
){events}
SELECT count(*) FROM done
"""
# The events' CTE of each statement, per event shape: `{src}` is the statement's rows.
ROW_EVENTS = {
    "submit": """, events AS (
    INSERT INTO {s}.events (job_id, job_version, queue, type, event, from_state, to_state,
                            attempt, at, run_at)
    SELECT id, 1, $3, $4, 'submitted', NULL, 'PENDING', 0, evora.clock_now(), evora.clock_now()
    FROM input
)""",
    "claim": """, events AS (
    INSERT INTO {s}.events (job_id, job_version, queue, type, event, from_state, to_state,
                            attempt, worker_id, at, run_at, started_at)
    SELECT r.id, 2 * r.attempt, r.queue, r.type, 'claimed', 'PENDING', 'RUNNING', r.attempt, $3,
           evora.clock_now(), p.run_at, r.started_at
    FROM ran r JOIN picked p ON p.id = r.id
)""",
    "complete": """, events AS (
    INSERT INTO {s}.events (job_id, job_version, queue, type, event, from_state, to_state,
                            attempt, worker_id, at, started_at)
    SELECT id, 2 * attempt + 1, queue, type, 'completed', 'RUNNING', 'COMPLETED', attempt,
           worker, evora.clock_now(), started_at
    FROM done
)""",
}
BATCH_EVENT_CTES = {
    "submit": """, events AS (
    INSERT INTO {s}.events (event, at, job_ids, versions, states, queues, types, run_ats)
    SELECT 'submitted', evora.clock_now(), array_agg(id), array_agg(1),
           array_agg('PENDING'::evora.job_state), array_agg($3::text), array_agg($4::text),
           array_agg(evora.clock_now())
    FROM input
)""",
    "claim": """, events AS (
    INSERT INTO {s}.events (event, worker_id, at, job_ids, versions, states, queues, types,
                            run_ats, started_ats)
    SELECT 'claimed', $3, evora.clock_now(), array_agg(r.id), array_agg(2 * r.attempt),
           array_agg('RUNNING'::evora.job_state), array_agg(r.queue), array_agg(r.type),
           array_agg(p.run_at), array_agg(r.started_at)
    FROM ran r JOIN picked p ON p.id = r.id HAVING count(*) > 0
)""",
    "complete": """, events AS (
    INSERT INTO {s}.events (event, worker_id, at, job_ids, versions, states, queues, types,
                            started_ats)
    SELECT 'completed', min(worker), evora.clock_now(), array_agg(id), array_agg(2 * attempt + 1),
           array_agg('COMPLETED'::evora.job_state), array_agg(queue), array_agg(type),
           array_agg(started_at)
    FROM done HAVING count(*) > 0
)""",
}
# Retention of a day: its finished jobs counted by queue and state (the promise the read
# models' counts rely on), then its partitions detached concurrently and dropped.
SPLIT_PRUNE_COUNT = """
INSERT INTO {s}.prune_counts AS c (queue, state, pruned)
SELECT j.queue, f.state, count(*) FROM {s}.{finished} f JOIN {s}.{jobs} j ON j.id = f.id
GROUP BY j.queue, f.state ORDER BY j.queue, f.state
ON CONFLICT (queue, state) DO UPDATE SET pruned = c.pruned + excluded.pruned
"""


@dataclass
class Phase:
    wal: float  # bytes per job
    fpi: float  # bytes of full-page images per job
    backend_us: float  # the client backends' CPU per job
    cluster_us: float  # every PostgreSQL process's CPU per job


@dataclass
class Shape:
    name: str
    phases: dict[str, list[Phase]] = field(default_factory=lambda: defaultdict(list))
    relations: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def prototype(self) -> str:
        """The schema of a prototype's tables."""
        return "evora" if self.evora else self.name.replace("-", "_")

    @property
    def evora(self) -> bool:
        return self.name == EVORA_SHAPE

    def sql(self, template: str, events: dict[str, str] | None = None, step: str = "") -> str:
        ctes = (events or {}).get(step, "")
        return template.replace("{events}", ctes).replace("{s}", self.prototype)

    def event_ctes(self) -> dict[str, str]:
        return BATCH_EVENT_CTES if self.name.startswith("split-batch") else ROW_EVENTS

    def schemas(self) -> list[str]:
        return [self.prototype]

    def partitioned(self) -> list[str]:
        """The prototype's tables partitioned by day (Evora's outbox has its own)."""
        if self.name in ("graphile", "today"):
            return []
        return ["jobs", "finished", "events"]

    def ddl(self) -> str:
        if self.name == "graphile":
            return GRAPHILE_SCHEMA
        if self.evora:
            return ""
        events = BATCH_EVENTS if self.name.startswith("split-batch") else SPLIT_EVENTS
        extra = {"gin": GIN_TIMELINE, "lean": NO_LEASE_INDEX}.get(self.name.split("-")[-1], "")
        return "\n".join([SPLIT_SCHEMA, events, extra]).replace("{s}", self.prototype)


async def day_of(conn: asyncpg.Connection) -> datetime:
    day: datetime = await conn.fetchval(
        "SELECT date_trunc('day', evora.clock_now() AT TIME ZONE 'UTC')"
    )
    return day


async def day_partitions(conn: asyncpg.Connection, shape: Shape) -> None:
    """The partitions of the clock's day, each partitioned table of the shape."""
    day = await day_of(conn)
    if shape.evora:
        await conn.execute("SELECT evora.make_event_partitions(86400, 3)")
    s = shape.prototype
    for table in shape.partitioned():
        name = f"{table}_p{day:%Y%m%d}"
        if await conn.fetchval("SELECT to_regclass($1)", f"{s}.{name}"):
            continue
        await conn.execute(
            f"CREATE TABLE {s}.{name} PARTITION OF {s}.{table} FOR VALUES"
            f" FROM ('{day:%Y-%m-%d} UTC') TO ('{day:%Y-%m-%d} UTC'::timestamptz"
            " + interval '1 day')"
        )
        if table in ("jobs", "finished"):
            await conn.execute(f"ALTER TABLE {s}.{name} ADD PRIMARY KEY (id)")


class Workload:
    """Submit, drain and retention of one shape, on its own connections (opened before any
    phase is measured, so that none exits while the CPU is read)."""

    def __init__(self, shape: Shape, dsn: str) -> None:
        self.shape = shape
        self.dsn = dsn
        self.pool: asyncpg.Pool | None = None
        self.store: JobStore | None = None
        self.conn: asyncpg.Connection | None = None

    async def open(self) -> None:
        if self.shape.evora:
            self.pool = await create_pool(self.dsn, min_size=2, max_size=2)
            self.store = JobStore(self.pool)
        else:
            self.conn = await asyncpg.connect(self.dsn)

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()
        if self.pool is not None:
            await self.pool.close()
        if self.conn is not None:
            await self.conn.close()

    async def submit(self, jobs: int) -> None:
        if self.store is not None:
            await submit(self.store, jobs)
            return
        assert self.conn is not None
        for start in range(0, jobs, SUBMIT_BATCH):
            size = min(SUBMIT_BATCH, jobs - start)
            payloads = [f'{{"n": {i}}}' for i in range(size)]
            if self.shape.name == "graphile":
                await self.conn.fetchval(GRAPHILE_SUBMIT, payloads)
            else:
                sql = self.shape.sql(SPLIT_SUBMIT, self.shape.event_ctes(), "submit")
                await self.conn.fetchval(sql, uuid7s(size), payloads, QUEUE, "noop")

    async def drain(self, batch: int) -> int:
        if self.store is not None:
            return await drain(self.store, batch)
        assert self.conn is not None
        drained = 0
        if self.shape.name == "graphile":
            task: int = await self.conn.fetchval(
                "SELECT id FROM graphile._private_tasks WHERE identifier = 'noop'"
            )
            while rows := await self.conn.fetch(GRAPHILE_CLAIM, WORKER, [task], batch):
                await self.conn.execute(GRAPHILE_COMPLETE, [r["id"] for r in rows])
                drained += len(rows)
            return drained
        claim = self.shape.sql(SPLIT_CLAIM, self.shape.event_ctes(), "claim")
        complete = self.shape.sql(SPLIT_COMPLETE, self.shape.event_ctes(), "complete")
        while rows := await self.conn.fetch(claim, QUEUE, batch, WORKER):
            done = await self.conn.fetchval(
                complete, [r["id"] for r in rows], [r["token"] for r in rows]
            )
            assert done == len(rows), (self.shape.name, done, len(rows))
            drained += len(rows)
        return drained


async def retention(conn: asyncpg.Connection, shape: Shape, day: datetime, batch: int) -> None:
    """Removes the day's finished jobs and their history as the shape would."""
    if shape.name == "graphile":
        return  # a completed job was deleted by its completion; graphile-worker keeps none
    if shape.evora:
        while await conn.fetchval("SELECT evora.prune_finished(0, $1, 'COMPLETED')", batch):
            pass
        # the day's partition of the rows and its twin of the batches (migration 0064), as
        # retention removes a range (evora.expired_event_tables())
        parts = await conn.fetch(
            "SELECT parent, name FROM evora.event_tables()"
            " WHERE lower = $1::timestamp AT TIME ZONE 'UTC'",
            day,
        )
        assert {p["parent"] for p in parts} == EVENT_TABLES, parts
        for part in parts:
            await detach_and_drop(conn, part["parent"], f"evora.{part['name']}")
        return
    s = shape.prototype
    await conn.execute(
        SPLIT_PRUNE_COUNT.replace("{s}", s)
        .replace("{finished}", f"finished_p{day:%Y%m%d}")
        .replace("{jobs}", f"jobs_p{day:%Y%m%d}")
    )
    for table in shape.partitioned():
        await detach_and_drop(conn, f"{s}.{table}", f"{s}.{table}_p{day:%Y%m%d}")


async def detach_and_drop(conn: asyncpg.Connection, parent: str, partition: str) -> None:
    await conn.execute(f"ALTER TABLE {parent} DETACH PARTITION {partition} CONCURRENTLY")
    await conn.execute(f"DROP TABLE {partition}")


async def client_backends(conn: asyncpg.Connection) -> list[int]:
    return [
        r["pid"]
        for r in await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
        )
    ]


def cpu_of(pids: list[int]) -> float:
    return sum(procstats.cpu_seconds(pid) or 0.0 for pid in pids)


async def relation_names(conn: asyncpg.Connection) -> dict[int, str]:
    """Each relation's file node, named by schema and name (a partition by its parent's name
    and `_p*`; a TOAST table and its index by their table's name and ` TOAST`: where a
    batch's compressed arrays go), catalogs too (whose pg_class.relfilenode is 0)."""
    rows = await conn.fetch(
        "SELECT pg_relation_filenode(c.oid)::int8 AS node,"
        " coalesce(tn.nspname || '.' || t.relname || ' TOAST', n.nspname || '.' || c.relname)"
        " AS name"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " LEFT JOIN pg_index x ON x.indexrelid = c.oid"
        " LEFT JOIN pg_class t ON t.reltoastrelid IN (c.oid, x.indrelid)"
        " LEFT JOIN pg_namespace tn ON tn.oid = t.relnamespace"
        " WHERE pg_relation_filenode(c.oid) IS NOT NULL"
    )
    return {r["node"]: re.sub(r"_p\d{8}", "_p*", r["name"]) for r in rows}


async def wal_by_relation(
    conn: asyncpg.Connection, start: str, end: str, names: dict[int, str]
) -> dict[str, float]:
    """Bytes of WAL per relation between two flushed LSNs: each record whole (full-page
    images included), for the relation of its first block; records without a block (commits,
    running-xacts) under `(no block)`."""
    if await conn.fetchval("SELECT $2::text::pg_lsn - $1::text::pg_lsn", start, end) < 1024:
        return {}
    await conn.fetchval("SELECT pg_logical_emit_message(false, 'bench', 'flush', true)")
    rows = await conn.fetch(
        "SELECT b.relfilenode::int8 AS node, sum(b.record_length)::int8 AS bytes"
        " FROM (SELECT f.relfilenode, f.record_length,"
        "       row_number() OVER (PARTITION BY f.start_lsn ORDER BY f.block_id) AS rn"
        "       FROM pg_get_wal_block_info($1::text::pg_lsn, $2::text::pg_lsn, true) f) b"
        " WHERE b.rn = 1 GROUP BY 1",
        start,
        end,
    )
    total: int = await conn.fetchval(
        "SELECT coalesce(sum(record_size + fpi_size), 0)::int8"
        " FROM pg_get_wal_stats($1::text::pg_lsn, $2::text::pg_lsn)",
        start,
        end,
    )
    by: dict[str, float] = defaultdict(float)
    for r in rows:
        by[names.get(r["node"], f"dropped or other ({r['node']})")] += r["bytes"]
    by["(no block)"] = total - sum(r["bytes"] for r in rows)
    return by


async def round_of(
    shape: Shape,
    dsn: str,
    args: argparse.Namespace,
    postmaster: int,
    measured: bool,
    last: bool,
) -> None:
    conn = await asyncpg.connect(dsn)
    work = Workload(shape, dsn)
    try:
        await day_partitions(conn, shape)
        day = await day_of(conn)
        await work.open()
        names = await relation_names(conn)
        counts: dict[str, int] = {}

        async def phase(name: str, run: Callable[[], Awaitable[Any]], checkpoint: bool) -> None:
            if checkpoint and not args.no_checkpoints:
                await conn.execute("CHECKPOINT")
            pids = await client_backends(conn)
            l0, w0, _ = await wal(conn)
            b0, c0 = cpu_of(pids), procstats.cluster_cpu_seconds(postmaster)
            result = await run()
            b1, c1 = cpu_of(pids), procstats.cluster_cpu_seconds(postmaster)
            l1, w1, _ = await wal(conn)
            if isinstance(result, int):
                counts[name] = result
            if not measured:
                return
            jobs = args.jobs
            fpi = await fpi_bytes(conn, l0, l1)
            shape.phases[name].append(
                Phase((w1 - w0) / jobs, fpi / jobs, (b1 - b0) / jobs * 1e6, (c1 - c0) / jobs * 1e6)
            )
            if last:
                names.update(await relation_names(conn))
                shape.relations[name] = {
                    k: v / jobs for k, v in (await wal_by_relation(conn, l0, l1, names)).items()
                }

        schemas = shape.schemas()

        async def vacuum() -> None:
            await conn.execute(f"VACUUM (ANALYZE false) {', '.join(await tables(conn, schemas))}")

        await phase("submit", lambda: work.submit(args.jobs), checkpoint=True)
        await phase("drain", lambda: work.drain(args.batch), checkpoint=True)
        assert counts["drain"] == args.jobs, (shape.name, counts)
        await phase("vacuum", vacuum, checkpoint=False)
        names.update(await relation_names(conn))
        await phase("retention", lambda: retention(conn, shape, day, 1000), checkpoint=True)
        await phase("vacuum 2", vacuum, checkpoint=False)
        await check_empty(conn, shape)
    finally:
        await work.close()
        await conn.close()


async def check_empty(conn: asyncpg.Connection, shape: Shape) -> None:
    """Nothing of the round's jobs is left (graphile: no job; today: no job or event of the
    queue, rows or batches; split: no ready, running or partitioned row)."""
    if shape.name == "graphile":
        left = await conn.fetchval("SELECT count(*) FROM graphile._private_jobs")
    elif shape.evora:
        left = await conn.fetchval(
            "SELECT (SELECT count(*) FROM evora.jobs WHERE queue = $1)"
            " + (SELECT count(*) FROM evora.job_events WHERE queue = $1)",
            QUEUE,
        )
    else:
        s = shape.prototype
        left = await conn.fetchval(
            f"SELECT (SELECT count(*) FROM {s}.ready) + (SELECT count(*) FROM {s}.running)"
            f" + (SELECT count(*) FROM {s}.jobs) + (SELECT count(*) FROM {s}.finished)"
            f" + (SELECT count(*) FROM {s}.events)"
        )
    assert left == 0, (shape.name, left)


def medians(shape: Shape) -> dict[str, Phase]:
    out = {
        name: Phase(
            statistics.median(p.wal for p in runs),
            statistics.median(p.fpi for p in runs),
            statistics.median(p.backend_us for p in runs),
            statistics.median(p.cluster_us for p in runs),
        )
        for name, runs in shape.phases.items()
    }
    # The whole life: each round's phases summed, then the median over rounds.
    rounds = range(len(shape.phases["drain"]))
    whole = [
        Phase(
            sum(shape.phases[n][r].wal for n in PHASES),
            sum(shape.phases[n][r].fpi for n in PHASES),
            sum(shape.phases[n][r].backend_us for n in PHASES),
            sum(shape.phases[n][r].cluster_us for n in PHASES),
        )
        for r in rounds
    ]
    out["whole life"] = Phase(
        statistics.median(p.wal for p in whole),
        statistics.median(p.fpi for p in whole),
        statistics.median(p.backend_us for p in whole),
        statistics.median(p.cluster_us for p in whole),
    )
    out["submit + drain"] = Phase(
        statistics.median(
            shape.phases["submit"][r].wal + shape.phases["drain"][r].wal for r in rounds
        ),
        statistics.median(
            shape.phases["submit"][r].fpi + shape.phases["drain"][r].fpi for r in rounds
        ),
        statistics.median(
            shape.phases["submit"][r].backend_us + shape.phases["drain"][r].backend_us
            for r in rounds
        ),
        statistics.median(
            shape.phases["submit"][r].cluster_us + shape.phases["drain"][r].cluster_us
            for r in rounds
        ),
    )
    return out


def _ratio(value: float, base: float) -> str:
    """`value` as a multiple of `base`; a base of nothing (a CPU time below the clock's tick,
    with a few hundred jobs) has none."""
    return f"{value / base:5.2f}x" if base > 0 else "  n/a "


def report(shapes: list[Shape], top: int) -> list[str]:
    lines = [
        "medians per job: WAL B (of it full-page images), client backends' CPU us,"
        " whole cluster's CPU us"
    ]
    columns = [*PHASES, "submit + drain", "whole life"]
    for shape in shapes:
        m = medians(shape)
        lines.append(f"  {shape.name}:")
        lines.extend(
            f"    {c:<15} WAL {m[c].wal:7,.0f} B ({m[c].fpi:5,.0f})"
            f"  backend {m[c].backend_us:6.1f} us  cluster {m[c].cluster_us:6.1f} us"
            for c in columns
        )
    graphile = next((s for s in shapes if s.name == "graphile"), None)
    if graphile is not None:
        g = medians(graphile)
        lines.append("against graphile (WAL submit + drain, whole life; backend CPU the same):")
        for shape in shapes:
            m = medians(shape)
            lines.append(
                f"  {shape.name:<16} {_ratio(m['submit + drain'].wal, g['submit + drain'].wal)}"
                f" {_ratio(m['whole life'].wal, g['whole life'].wal)} WAL;"
                f" {_ratio(m['submit + drain'].backend_us, g['submit + drain'].backend_us)}"
                f" {_ratio(m['whole life'].backend_us, g['whole life'].backend_us)} CPU"
            )
    lines.append(f"the last round's WAL by relation, top {top} per phase (B per job):")
    for shape in shapes:
        for phase, by in shape.relations.items():
            best = sorted(by.items(), key=lambda kv: -kv[1])[:top]
            lines.append(f"  {shape.name} {phase}: " + ", ".join(f"{k} {v:,.0f}" for k, v in best))
        whole: dict[str, float] = defaultdict(float)
        for by in shape.relations.values():
            for k, v in by.items():
                whole[k] += v
        best = sorted(whole.items(), key=lambda kv: -kv[1])[:top]
        lines.append(f"  {shape.name} whole life: " + ", ".join(f"{k} {v:,.0f}" for k, v in best))
    return lines


async def set_clock(admin_dsn: str, days: int) -> None:
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f"ALTER DATABASE {DATABASE} SET evora.clock_offset = '{days} days'")
    finally:
        await admin.close()


async def run(args: argparse.Namespace, pg: LocalPostgres, postmaster: int) -> None:
    admin_dsn = pg.dsn("postgres")
    dsn = pg.dsn(DATABASE)
    shapes = [Shape(name) for name in args.shapes]
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f"CREATE DATABASE {DATABASE}")
    finally:
        await admin.close()
    await apply_migrations(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        for shape in shapes:
            if shape.ddl():
                await conn.execute(shape.ddl())
    finally:
        await conn.close()
    # Round 0 is a warm-up (the tables' first pages, the catalogs' caches), not counted.
    # Round r runs on day r + 1: the migrations' first job_events partition ends a minute
    # after they ran, and the next one at midnight; whole days start the day after.
    for round_ in range(args.rounds + 1):
        await set_clock(admin_dsn, round_ + 1)
        for shape in shapes:
            await round_of(shape, dsn, args, postmaster, round_ > 0, round_ == args.rounds)
            if round_ > 0:
                p = {k: v[-1] for k, v in shape.phases.items()}
                print(
                    f"round {round_} {shape.name:<16} "
                    + "; ".join(
                        f"{k} {v.wal:,.0f} B {v.backend_us:.1f}/{v.cluster_us:.1f} us"
                        for k, v in p.items()
                    ),
                    flush=True,
                )
    for line in report(shapes, args.top):
        print(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs per round and shape")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (after a warm-up)")
    parser.add_argument("--batch", type=int, default=100, help="jobs per claim and completion")
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--top", type=int, default=8, help="relations shown per phase")
    parser.add_argument(
        "--no-checkpoints",
        action="store_true",
        help="no CHECKPOINT before a phase: full-page images only where the run's own"
        " checkpoints (timed, or by WAL volume) fall",
    )
    args = parser.parse_args()
    on_fresh_cluster("evora-shapes-", lambda pg, postmaster: run(args, pg, postmaster))
    return 0


if __name__ == "__main__":
    sys.exit(main())
