"""What the store-level benchmarks read from PostgreSQL about a statement or an index: its
plan's time, buffers and indexes (EXPLAIN ANALYZE), the indexes' sizes, and how long building
an index again takes (what an upgrade that makes it holds writes back for)."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

import asyncpg


def indexes_used(plan: dict[str, Any]) -> set[str]:
    found = {plan["Index Name"]} if "Index Name" in plan else set()
    for child in plan.get("Plans", []):
        found |= indexes_used(child)
    return found


async def explain(
    conn: asyncpg.Connection, sql: str, args: list[Any], repeat: int
) -> tuple[float, int, set[str]]:
    """The median execution time (ms) of `repeat` EXPLAIN ANALYZE runs of `sql`, and the last
    run's shared buffers and the indexes its plan read."""
    times, buffers, used = [], 0, set()
    for _ in range(repeat):
        [row] = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", *args)
        [result] = json.loads(row[0])
        times.append(result["Execution Time"])
        plan = result["Plan"]
        buffers = int(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))
        used = indexes_used(plan)
    return statistics.median(times), buffers, used


async def print_index_sizes(conn: asyncpg.Connection, names: Sequence[str] | None = None) -> None:
    """One line: the size of each index of evora.jobs (of `names` only, if given)."""
    sizes = await conn.fetch(
        "SELECT c.relname, pg_relation_size(c.oid) AS bytes FROM pg_index i"
        " JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE i.indrelid = 'evora.jobs'::regclass"
        "   AND ($1::text[] IS NULL OR c.relname = ANY($1::text[])) ORDER BY 1",
        None if names is None else list(names),
    )
    print("  indexes: " + ", ".join(f"{r['relname']} {r['bytes'] / 2**20:.1f} MB" for r in sizes))


async def print_rebuild_times(conn: asyncpg.Connection, names: Sequence[str]) -> None:
    """Drops and builds again each of the indexes `names` that exists, printing the time."""
    for name in names:
        definition = await conn.fetchval(
            "SELECT pg_get_indexdef(c.oid) FROM pg_class c"
            " WHERE c.relname = $1 AND c.relnamespace = 'evora'::regnamespace",
            name,
        )
        if definition is None:
            continue
        await conn.execute(f"DROP INDEX evora.{name}")
        started = time.perf_counter()
        await conn.execute(definition)
        print(f"  build {name}: {time.perf_counter() - started:.2f} s")
