"""NOTIFY hints that wake dispatchers (rule 7 of docs/architecture.md: a hint, never the
guarantee).

Every notifying commit takes a cluster-wide lock, so a process sends at most one
`pg_notify` per queue per `DEBOUNCE_SECONDS`. Writers pass `suppressed()` into their
statement, which notifies only the queues not in it and reports back both what it notified
and which of its queues it left out. A left-out queue is owed a hint: once its commit is
done the writer calls `owe()`, and the debouncer sends one trailing `pg_notify` for all owed
queues when their window ends (not a whole window after the commit). A job committed inside
a suppressed window therefore waits at most what is left of that window for its hint, and
dispatchers never need to guess when to claim again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

log = logging.getLogger(__name__)

JOBS_CHANNEL = "evora_jobs"
# Short enough to stay out of the submit-to-start latency, long enough that a busy process
# sends a few hundred hints a second per queue, not one per commit.
DEBOUNCE_SECONDS = 0.002

# Sends a hint for each of these queues (its own statement, outside any transaction).
SendHints = Callable[[list[str]], Awaitable[None]]


class NotifyDebouncer:
    def __init__(self, send: SendHints, interval: float = DEBOUNCE_SECONDS) -> None:
        self._send = send
        self._interval = interval
        self._last: dict[str, float] = {}
        self._owed: set[str] = set()
        self._trailing: asyncio.Task[None] | None = None

    def suppressed(self) -> list[str]:
        now = time.monotonic()
        fresh = {q: t for q, t in self._last.items() if now - t < self._interval}
        self._last = fresh
        return list(fresh)

    def record(self, queues: Iterable[str] | None) -> None:
        if not queues:
            return
        now = time.monotonic()
        for queue in queues:
            self._last[queue] = now
            self._owed.discard(queue)

    def owe(self, queues: Iterable[str] | None) -> None:
        """Queues whose committed change was not announced: hint them when the window ends."""
        if not queues:
            return
        self._owed.update(queues)
        if self._trailing is None:
            self._trailing = asyncio.get_running_loop().create_task(self._send_trailing())

    def _window_end(self, queue: str) -> float:
        return self._last.get(queue, -self._interval) + self._interval

    async def _send_trailing(self) -> None:
        try:
            if not self._owed:  # a later statement notified them all before this started
                return
            # Until the earliest owed window ends, not a whole window from now: a job
            # committed late in a window would otherwise wait up to twice the window.
            ends = min(self._window_end(queue) for queue in self._owed)
            await asyncio.sleep(max(0.0, ends - time.monotonic()))
            # A notification sent meanwhile by a later statement settled its queue already;
            # a queue whose window ends later stays owed, for the next round.
            owed = sorted(q for q in self._owed if self._window_end(q) <= ends)
            self._owed.difference_update(owed)
            if owed:
                await self._send(owed)
                self.record(owed)
        except Exception:
            # The dispatchers' fallback poll still finds these jobs, only later.
            log.warning("could not send trailing job hints", exc_info=True)
        finally:
            self._trailing = None
            if self._owed:
                self._trailing = asyncio.get_running_loop().create_task(self._send_trailing())

    async def close(self) -> None:
        """Send what is still owed before the pool goes away."""
        while self._trailing is not None:
            await self._trailing
