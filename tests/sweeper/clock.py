"""A clock the test moves: schedulers given it see time pass only when the test says so."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta


class FakeClock:
    def __init__(self, start: datetime) -> None:
        self._now = start
        self._moved = asyncio.Event()

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta) -> None:
        self.set(self._now + delta)

    def set(self, when: datetime) -> None:
        self._now = when
        self._moved.set()
        self._moved = asyncio.Event()

    async def sleep_until(self, when: datetime, stop: asyncio.Event) -> None:
        while self._now < when and not stop.is_set():
            waits = {asyncio.ensure_future(self._moved.wait()), asyncio.ensure_future(stop.wait())}
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                # not each awaited under suppress(CancelledError): that would also swallow a
                # cancel of this task arriving meanwhile (a test cancels scheduler loops), and
                # the loop would run on; gather() passes one on
                for wait in waits:
                    wait.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
