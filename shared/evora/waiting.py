"""Waiting that a stop can cut short, and the backoff the sweeper's loops retry with."""

from __future__ import annotations

import asyncio
import contextlib
import random

BACKOFF_INITIAL = 0.2
BACKOFF_MAX = 10.0


async def wait_until_set(event: asyncio.Event, seconds: float) -> bool:
    """Sleep up to `seconds`, returning early (True) as soon as `event` is set."""
    if event.is_set():
        return True
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), max(seconds, 0.0))
    return event.is_set()


class Backoff:
    """Exponential delays with jitter, so replicas that lost the database together do not
    all come back at the same instant."""

    def __init__(self, initial: float = BACKOFF_INITIAL, maximum: float = BACKOFF_MAX) -> None:
        self._initial = initial
        self._maximum = maximum
        self._next = initial

    def reset(self) -> None:
        self._next = self._initial

    def next(self) -> float:
        delay = self._next * (0.5 + random.random())
        self._next = min(self._next * 2, self._maximum)
        return delay
