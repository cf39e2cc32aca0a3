"""evora.clock_now(), the one clock of every time-dependent statement (migration 0009): the
database's own now() in production, at no cost, and runs ahead only where a test says so."""

from __future__ import annotations

import asyncpg

from evora.storage import queries
from tests.conftest import Clock


async def test_unset_it_is_now_and_costs_no_function_call(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn, conn.transaction():
        assert await conn.fetchval("SELECT evora.clock_now() = now()")
        # Inlined by the planner: the plan evaluates now() + the offset itself, as it did
        # now(), with no call of evora.clock_now() per row.
        plan = "\n".join(
            r[0]
            for r in await conn.fetch(
                "EXPLAIN (VERBOSE) SELECT id FROM evora.jobs WHERE lease_expires_at <"
                " evora.clock_now()"
            )
        )
    assert "clock_now" not in plan and "now()" in plan


async def test_advance_runs_every_new_connection_ahead(
    pool: asyncpg.Pool, clock: Clock, db_url: str
) -> None:
    await clock.advance(90)
    await clock.advance(30)
    ahead = await pool.fetchval("SELECT extract(epoch FROM evora.clock_now() - now())")
    assert ahead == 120
    other = await asyncpg.connect(db_url)  # a service's connection sees the same time
    try:
        assert await other.fetchval("SELECT extract(epoch FROM evora.clock_now() - now())") == 120
    finally:
        await other.close()


def test_the_statements_read_the_clock_not_now() -> None:
    # A statement reading now() directly would not see a test's clock. The submission is
    # the exception: a delay counts from the real now(), which only makes a delayed job due
    # early under a clock run ahead.
    statements = {
        name: text
        for name, text in vars(queries).items()
        if isinstance(text, str) and name.isupper() and name != "SUBMIT"
    }
    assert statements, "no statements found"
    for name, text in statements.items():
        assert "now()" not in text.replace("evora.clock_now()", ""), name
