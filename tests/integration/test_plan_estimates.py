"""The hot statements are planned at what their items cost, so no build compiles them with JIT.

PostgreSQL compiles a statement with LLVM when its estimated cost passes `jit_above_cost`
(100,000 by default), on builds that have JIT (most distributions' and managed services') and
with `jit = on` (the default). Compiling takes tens of milliseconds, far more than these
statements take to run: on Debian's PostgreSQL 15 an ack of 100 items took ~60 ms instead of
~5 (issue 34). A row estimate far from the truth gets a statement there: a set-returning
PL/pgSQL function is assumed to return 1,000 rows unless it says otherwise, so the items of
an ack joined to evora.record_moves() (one row, always) were planned as 100,000 rows.

An application's own session runs evora.submit() with whatever JIT settings it has, so the
estimates are what must be right, whatever Evora's own sessions set. Each cost is read from
the plan an execution actually used (auto_explain, nested statements included, so the plans
inside the functions count too): the custom plans asyncpg's prepared statements get first,
and the generic plan PostgreSQL may keep from the sixth run, forced here. Costs do not
depend on whether the build has JIT, and no timing is involved."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import orjson
import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.db import connect, jsonb_elements
from evora.storage.submissions import store

ITEMS = 100  # a full batch of acks, and a claim's usual maximum
# Enough runs of each prepared statement for PostgreSQL to weigh the generic plan (from the
# sixth), while the tables grow as they do under load.
RUNS = 7
PLANS = ("auto", "force_generic_plan")

# asyncpg's own query for the types of a statement's columns, once per connection and type,
# costs millions on any build: one reason Evora's sessions run with `jit = off` (db.py); not
# one of the statements measured here.
ASYNCPG_INTROSPECTION = "typeinfo_tree"

Plan = tuple[str, float, float]  # the statement, its total cost, its rows

NAMES = {text: name for name, text in vars(queries).items() if isinstance(text, str)}


def named(query: str) -> str:
    """The statement's name in evora.storage.queries, else (a function's) its first line."""
    return NAMES.get(query) or query.strip().splitlines()[0]


@pytest.fixture
async def explained(db_url: str) -> AsyncIterator[tuple[asyncpg.Connection, list[Plan]]]:
    """A connection whose every plan, nested ones included, is collected as it runs."""
    conn = await connect(db_url)
    plans: list[Plan] = []

    def collect(_: Any, message: Any) -> None:
        text: str = message.message
        if "plan:" in text:
            plan = orjson.loads(text.split("plan:", 1)[1])
            if ASYNCPG_INTROSPECTION in plan["Query Text"]:
                return
            top = plan["Plan"]
            plans.append((named(plan["Query Text"]), top["Total Cost"], top["Plan Rows"]))

    conn.add_log_listener(collect)
    for setting in (
        "LOAD 'auto_explain'",
        "SET auto_explain.log_min_duration = 0",
        "SET auto_explain.log_nested_statements = on",
        "SET auto_explain.log_format = json",
        "SET auto_explain.log_level = notice",
    ):
        await conn.execute(setting)
    try:
        yield conn, plans
    finally:
        conn.remove_log_listener(collect)
        await conn.close()


async def submit(conn: asyncpg.Connection, queue: str) -> None:
    async def change(
        conn: asyncpg.Connection, query: str, *args: Any, committed: bool, with_jobs: bool
    ) -> list[asyncpg.Record]:
        rows: list[asyncpg.Record] = await conn.fetch(query, *args, [], with_jobs)
        return rows

    subs = [JobSubmission(queue=queue, type="t") for _ in range(ITEMS)]
    await store(conn, change, subs, committed=True, with_jobs=False)


async def claim(conn: asyncpg.Connection, queue: str) -> tuple[list[object], list[object]]:
    rows = await conn.fetch(queries.CLAIM, [queue], None, ITEMS, "w")
    assert len(rows) == ITEMS
    return [r["job"]["id"] for r in rows], [r["job"]["lease_token"] for r in rows]


async def test_hot_statements_for_a_full_batch_cost_less_than_jit_above_cost(
    explained: tuple[asyncpg.Connection, list[Plan]],
) -> None:
    conn, plans = explained
    threshold = float(await conn.fetchval("SELECT current_setting('jit_above_cost')"))
    for mode in PLANS:
        await conn.execute(f"SET plan_cache_mode = {mode}")
        for _ in range(RUNS):
            await submit(conn, "acked")
            ids, tokens = await claim(conn, "acked")
            rows = await conn.fetch(
                queries.COMPLETE, ids, tokens, jsonb_elements(None for _ in ids), [], False
            )
            assert [r["outcome"] for r in rows] == ["done"] * ITEMS
            await submit(conn, "failed")
            ids, tokens = await claim(conn, "failed")
            errors = [{"message": "boom", "type": None} for _ in ids]
            retryable = [True] * ITEMS
            rows = await conn.fetch(
                queries.FAIL,
                ids,
                tokens,
                errors,
                retryable,
                [None] * ITEMS,
                [None] * ITEMS,
                [],
                False,
            )
            assert [r["outcome"] for r in rows] == ["done"] * ITEMS
    assert len(plans) > 4 * len(PLANS) * RUNS  # the nested statements' plans came too
    too_costly = sorted({plan for plan in plans if plan[1] >= threshold}, key=lambda p: -p[1])
    assert not too_costly, f"plans at or above jit_above_cost = {threshold}: {too_costly[:10]}"


async def test_evora_sessions_run_without_jit(db_url: str, pool: asyncpg.Pool) -> None:
    conn = await connect(db_url)
    try:
        assert await conn.fetchval("SHOW jit") == "off"
    finally:
        await conn.close()
    assert await pool.fetchval("SHOW jit") == "off"
