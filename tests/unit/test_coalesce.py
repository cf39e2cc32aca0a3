"""The coalescer's handling of a flush that would wait for a lock (evora.coalesce): the item
that needs it waits alone, out of line; the items beside it and behind it go on. The
database side of this is in tests/integration/test_coalescing.py."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from evora.coalesce import Coalescer


class Contended(Exception):
    """What a flush raises when it would wait for a lock held elsewhere."""


HELD = 0  # the item whose lock another transaction holds


async def test_the_item_that_needs_a_held_lock_waits_alone_and_out_of_line() -> None:
    released = asyncio.Event()
    flushed: list[list[int]] = []

    async def flush(items: Sequence[int]) -> list[int]:
        flushed.append(list(items))
        if HELD in items:
            raise Contended
        return [item * 10 for item in items]

    async def patient(items: Sequence[int]) -> list[int]:
        assert list(items) == [HELD]
        await released.wait()
        return [-1]

    coalescer: Coalescer[int, int] = Coalescer(
        flush, contended=lambda exc: isinstance(exc, Contended), patient=patient
    )
    held = asyncio.create_task(coalescer.submit(HELD))
    beside = [asyncio.create_task(coalescer.submit(item)) for item in range(1, 6)]
    assert await asyncio.gather(*beside) == [10, 20, 30, 40, 50]
    behind = [asyncio.create_task(coalescer.submit(item)) for item in range(6, 9)]
    assert await asyncio.gather(*behind) == [60, 70, 80]

    assert not held.done()
    assert flushed[0] == [0, 1, 2, 3, 4, 5]  # one batch, split until the held item is alone
    assert [HELD] in flushed and [6, 7, 8] in flushed
    released.set()
    assert await held == -1
    await coalescer.close()


async def test_without_a_patient_flush_a_contended_item_gets_the_error() -> None:
    async def flush(items: Sequence[int]) -> list[int]:
        raise Contended

    coalescer: Coalescer[int, int] = Coalescer(flush, contended=lambda exc: True)
    answers = await asyncio.gather(*(coalescer.submit(i) for i in range(4)), return_exceptions=True)
    await coalescer.close()
    assert all(isinstance(answer, Contended) for answer in answers)
