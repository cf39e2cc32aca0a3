"""The one way tests wait for the system under test: poll something it shows (a row, a
metric, a log line) until it holds, within a bound, never a fixed sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

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
