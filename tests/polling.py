"""The one way tests wait for the system under test: poll something it shows (a row, a
metric, a log line) until it holds, within a bound, never a fixed sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import asyncpg

Condition = Callable[[], bool | Awaitable[bool]]

POLL_SECONDS = 0.01


async def until(
    condition: Condition, what: str = "the condition", *, within: float = 10.0
) -> float:
    """Poll `condition` (sync or async) until it is true; return the seconds it took. Fails
    the test with `what` after `within` seconds."""
    started = time.monotonic()
    while True:
        outcome = condition()
        if not isinstance(outcome, bool):
            outcome = await outcome
        if outcome:
            return time.monotonic() - started
        if time.monotonic() - started > within:
            raise AssertionError(f"not reached within {within}s: {what}")
        await asyncio.sleep(POLL_SECONDS)


async def waits_for_a_lock(pool: asyncpg.Pool) -> None:
    """Until a statement of the test's database waits for a lock (the row or advisory lock a
    held transaction keeps): the moment a race test commits the holder."""

    async def waiting() -> bool:
        return bool(
            await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
        )

    await until(waiting, "a statement waits for the held lock")
