"""The wake-up bookkeeping on its own: how often a queue's next due time is read."""

from __future__ import annotations

import asyncio

from evora_services.dispatcher.wakeups import TIMER_REFRESH_SECONDS, Cause, Wakeups


async def test_a_burst_of_hints_reads_the_due_time_twice_and_keeps_the_last_answer() -> None:
    reads: list[float] = []
    due = {"q": 60.0}
    second_read = asyncio.Event()

    async def due_in(queue: str) -> float | None:
        reads.append(due[queue])
        if len(reads) == 2:
            second_read.set()
        return due[queue]

    woken: list[Cause] = []
    wakeups = Wakeups(due_in, lambda queue, cause: woken.append(cause))
    waiter = wakeups.register(["q"])
    await asyncio.sleep(0)
    for _ in range(100):
        wakeups.notify("q")
    # a delayed job due soon arrives with the last hint of the burst
    due["q"] = 0.5
    wakeups.notify("q")
    # the trailing read comes once the refresh interval is up...
    await asyncio.wait_for(second_read.wait(), 5.0)
    # ...and no further one follows from the burst
    await asyncio.sleep(TIMER_REFRESH_SECONDS * 2)
    assert reads == [60.0, 0.5]
    wakeups.rearm(waiter)
    cause = await wakeups.wait(waiter, 2.0)
    assert cause is Cause.TIMER
    wakeups.close()


async def test_a_drained_claim_shape_is_trusted_only_while_nothing_could_have_changed() -> None:
    async def nothing_delayed(queue: str) -> float | None:
        return None

    wakeups = Wakeups(nothing_delayed)
    shape = (("q",), ("t",))

    def short_claim() -> None:
        wakeups.claimed(shape, wakeups.hints(["q"]), short=True)

    short_claim()
    assert not wakeups.drained(shape)  # hints are not heard yet: nothing is known
    wakeups.set_listening(True)
    short_claim()
    assert wakeups.drained(shape)
    assert not wakeups.drained((("q",), None))  # other types: another shape
    wakeups.notify("other")
    assert wakeups.drained(shape)
    wakeups.notify("q")
    assert not wakeups.drained(shape)
    short_claim()
    wakeups.set_listening(False)
    assert not wakeups.drained(shape)
    wakeups.set_listening(True)
    assert not wakeups.drained(shape)  # hints may have been missed while away
    short_claim()
    wakeups.poll()
    assert not wakeups.drained(shape)
    short_claim()
    wakeups.claimed(shape, wakeups.hints(["q"]), short=False)
    assert not wakeups.drained(shape)
    wakeups.close()
