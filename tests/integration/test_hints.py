"""NOTIFY hints (rule 7 of docs/architecture.md): debounced per process, and never withheld
for good."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import JobStore
from evora.storage.notify import JOBS_CHANNEL

WINDOW = 0.5
# Where a test measures within a window: the hints' arrival times carry the listener's
# delay, which a loaded machine stretches to a good part of a short window.
WIDE_WINDOW = 2.0


@pytest.fixture
async def hints(db_url: str) -> AsyncIterator[asyncio.Queue[tuple[float, str]]]:
    """(arrival time, queue) of every hint on the channel."""
    received: asyncio.Queue[tuple[float, str]] = asyncio.Queue()
    conn = await asyncpg.connect(db_url)

    def on_notify(_conn: object, _pid: int, _channel: str, queue: str) -> None:
        received.put_nowait((time.monotonic(), queue))

    await conn.add_listener(JOBS_CHANNEL, on_notify)
    try:
        yield received
    finally:
        await conn.close()


async def test_a_hint_held_back_late_in_the_window_waits_only_for_its_end(
    pool: asyncpg.Pool, hints: asyncio.Queue[tuple[float, str]]
) -> None:
    """The trailing hint goes when the open window ends, not a whole window after the
    commit that owed it: on the wake-up path, a job submitted just after another would
    otherwise wait up to twice the window."""
    store = JobStore(pool, hint_window=WIDE_WINDOW)
    try:
        await store.submit(JobSubmission(queue="q", type="t"))
        first, _ = await asyncio.wait_for(hints.get(), 5)
        # Placing the next commit late in the window (not a synchronisation).
        await asyncio.sleep(max(0.0, first + WIDE_WINDOW * 0.7 - time.monotonic()))
        await store.submit(JobSubmission(queue="q", type="t"))
        committed = time.monotonic()
        trailing, queue = await asyncio.wait_for(hints.get(), 5)
        assert queue == "q"
        assert trailing - first >= WIDE_WINDOW * 0.8  # still one hint per window
        assert trailing - committed < WIDE_WINDOW * 0.6  # what was left of it, not a whole one
    finally:
        await store.close()


async def test_a_held_back_hint_is_sent_when_the_window_ends(
    pool: asyncpg.Pool, hints: asyncio.Queue[tuple[float, str]]
) -> None:
    store = JobStore(pool, hint_window=WINDOW)
    try:
        await store.submit(JobSubmission(queue="q", type="t"))
        first, queue = await asyncio.wait_for(hints.get(), 5)
        assert queue == "q"
        # Inside the window: this commit sends no hint of its own...
        await store.submit_batch([JobSubmission(queue="q", type="t")] * 3)
        await store.submit(JobSubmission(queue="other", type="t"))
        _, other = await asyncio.wait_for(hints.get(), 5)
        assert other == "other"
        # ...but the one it owes arrives when the window ends, once for all held back.
        trailing, queue = await asyncio.wait_for(hints.get(), 5)
        assert queue == "q"
        assert trailing - first >= WINDOW * 0.8
        await asyncio.sleep(WINDOW * 2)
        assert hints.empty()
    finally:
        await store.close()
