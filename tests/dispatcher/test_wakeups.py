"""The wake-up bookkeeping on its own: how often a queue's next due time is read."""

from __future__ import annotations

import asyncio

from services.dispatcher.wakeups import TIMER_REFRESH_SECONDS, Cause, Wakeups


async def test_a_burst_of_hints_reads_the_due_time_twice_and_keeps_the_last_answer() -> None:
    reads: list[float] = []
    due = {"q": 60.0}

    async def due_in(queue: str) -> float | None:
        reads.append(due[queue])
        return due[queue]

    woken: list[Cause] = []
    wakeups = Wakeups(due_in, lambda queue, cause: woken.append(cause))
    waiter = wakeups.register(["q"])
    await asyncio.sleep(0)
    for _ in range(100):
        wakeups.notify("q")
    # a delayed job due soon arrives with the last hint of the burst
    due["q"] = TIMER_REFRESH_SECONDS * 2
    wakeups.notify("q")
    await asyncio.sleep(TIMER_REFRESH_SECONDS * 1.5)
    assert reads == [60.0, TIMER_REFRESH_SECONDS * 2]
    wakeups.rearm(waiter)
    cause = await wakeups.wait(waiter, 2.0)
    assert cause is Cause.TIMER
    wakeups.close()
