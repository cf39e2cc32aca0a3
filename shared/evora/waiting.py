"""Waiting that a stop can cut short, and the backoff the sweeper's loops retry with."""

from __future__ import annotations

import asyncio
import contextlib

from evora.protocol.retries import RetryBackoff

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
    """The delays of one loop's consecutive failures, by the formula every Evora client
    retries with (evora.protocol.retries): exponential with jitter, so replicas that lost
    the database together do not all come back at the same instant."""

    def __init__(self, initial: float = BACKOFF_INITIAL, maximum: float = BACKOFF_MAX) -> None:
        self._policy = RetryBackoff(initial=initial, max_delay=maximum)
        self._failures = 0

    def reset(self) -> None:
        self._failures = 0

    def next(self) -> float:
        self._failures += 1
        return self._policy.delay(self._failures)
