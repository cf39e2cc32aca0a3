"""Who to wake when: the waiting long-polls of one dispatcher process.

Each queue keeps its waiters in arrival order. A wake-up goes to ONE waiter of the queue,
never to all of them: a NOTIFY says only "something changed in this queue", not how much,
so the woken waiter claims, and if its batch came back full it passes the wake-up on
(`chain`). Many idle workers on one queue therefore cost one claim query per event, not a
thundering herd.

Wake-ups come from
- NOTIFY hints (a writer that held one back sends it when its debounce window ends),
- a timer per queue set to its earliest delayed job (the database says how far off it is),
- a slow fallback poll, and a catch-up pass after the LISTEN connection reconnects,
- shutdown, which answers every waiter at once.

A new long-poll normally claims at once. It skips that claim when its last claim for the
same queues and types came back short (it took everything claimable) and no hint, timer or
poll has touched those queues since: at low load this halves the claim queries, as every
worker asks again right after each job it gets. Only while the LISTEN connection is up,
since hints are what would have announced a new job.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from enum import StrEnum

log = logging.getLogger(__name__)

POLL_SECONDS = 2.0
# How often at most a queue's next due time is read. A job delayed by less than this may
# start up to this much late.
TIMER_REFRESH_SECONDS = 0.05
# Claim shapes (queues, types) remembered as drained; more are forgotten, not refused.
MAX_DRAINED = 10_000

ClaimShape = tuple[tuple[str, ...], tuple[str, ...] | None]


class Cause(StrEnum):
    NOTIFY = "notify"
    TIMER = "timer"
    POLL = "poll"
    CHAIN = "chain"
    RECONNECT = "reconnect"
    SHUTDOWN = "shutdown"


# Seconds until the earliest delayed job of a queue, by the database's clock.
DueLookup = Callable[[str], Awaitable[float | None]]
WakeObserver = Callable[[str, Cause], None]


class Waiter:
    __slots__ = ("future", "queues")

    def __init__(self, queues: tuple[str, ...], future: asyncio.Future[Cause]) -> None:
        self.queues = queues
        self.future = future


class Wakeups:
    def __init__(self, due_in: DueLookup, observe: WakeObserver | None = None) -> None:
        self._due_in = due_in
        self._observe = observe
        # dicts as ordered sets: FIFO wake order with O(1) removal
        self._waiting: dict[str, dict[Waiter, None]] = {}
        # per queue: the timer for its next delayed job, None when it has none; absent when
        # unknown (asked again when someone waits on the queue)
        self._timers: dict[str, asyncio.TimerHandle | None] = {}
        # queues whose due time is being read, or was read less than TIMER_REFRESH_SECONDS
        # ago; and those to read again when that time is up
        self._timer_refreshing: set[str] = set()
        self._timer_stale: set[str] = set()
        # hints and timers per queue, so a claim can tell whether anything happened since
        # the last claim found the queues drained
        self._hints: dict[str, int] = {}
        # claim shapes whose last claim came back short, with the hints count before it
        self._drained: dict[ClaimShape, int] = {}
        self._listening = False
        self._closing = False

    @property
    def closing(self) -> bool:
        return self._closing

    def waiting(self) -> dict[str, int]:
        return {q: len(w) for q, w in self._waiting.items() if w}

    def register(self, queues: Iterable[str]) -> Waiter:
        """Join the queues' lines *before* claiming, so a hint that arrives during the claim
        is not lost."""
        loop = asyncio.get_running_loop()
        waiter = Waiter(tuple(queues), loop.create_future())
        if self._closing:
            waiter.future.set_result(Cause.SHUTDOWN)
            return waiter
        for queue in waiter.queues:
            line = self._waiting.setdefault(queue, {})
            line[waiter] = None
            if queue not in self._timers:
                self._refresh_timer(queue)
        return waiter

    def rearm(self, waiter: Waiter) -> None:
        """Wait again after a claim came back empty."""
        if waiter.future.done() and not self._closing:
            waiter.future = asyncio.get_running_loop().create_future()
            for queue in waiter.queues:
                self._waiting.setdefault(queue, {})[waiter] = None

    def leave(self, waiter: Waiter, *, woken_unused: bool) -> None:
        """Leave all lines. A waiter that was woken but did not claim (its client left)
        passes the wake-up on so it is not lost."""
        for queue in waiter.queues:
            line = self._waiting.get(queue)
            if line is not None:
                line.pop(waiter, None)
        if not waiter.future.done():
            waiter.future.cancel()
        elif woken_unused and not self._closing:
            self.chain(waiter.queues)

    async def wait(self, waiter: Waiter, seconds: float) -> Cause | None:
        if seconds <= 0 and not waiter.future.done():
            return None
        done, _ = await asyncio.wait({waiter.future}, timeout=seconds)
        if not done or waiter.future.cancelled():
            return None
        return waiter.future.result()

    def _wake_one(self, queue: str, cause: Cause) -> bool:
        line = self._waiting.get(queue)
        while line:
            waiter = next(iter(line))
            for q in waiter.queues:
                other = self._waiting.get(q)
                if other is not None:
                    other.pop(waiter, None)
            if not waiter.future.done():
                waiter.future.set_result(cause)
                if self._observe is not None:
                    self._observe(queue, cause)
                return True
        return False

    def hints(self, queues: Iterable[str]) -> int:
        """A counter that moves whenever one of `queues` gets a hint."""
        return sum(self._hints.get(queue, 0) for queue in queues)

    def _touch(self, queue: str) -> None:
        self._hints[queue] = self._hints.get(queue, 0) + 1

    def set_listening(self, up: bool) -> None:
        """Whether the LISTEN connection is up. Hints missed while it was down may hide new
        jobs, so every claim shape counts as unknown again."""
        self._listening = up
        self._drained.clear()

    def drained(self, shape: ClaimShape) -> bool:
        """True when a claim of `shape` would find nothing: the last one came back short and
        nothing has touched its queues since it started."""
        before = self._drained.get(shape)
        return self._listening and before is not None and before == self.hints(shape[0])

    def claimed(self, shape: ClaimShape, hints_before: int, *, short: bool) -> None:
        """Record a claim's result (`short`: fewer jobs than it asked for)."""
        if not short:
            self._drained.pop(shape, None)
            return
        if len(self._drained) >= MAX_DRAINED:
            self._drained.clear()
        self._drained[shape] = hints_before

    def notify(self, queue: str) -> None:
        """A hint that `queue` changed: wake one waiter, and re-read when its next delayed
        job is due."""
        self._touch(queue)
        if not self._waiting.get(queue):
            return
        self._wake_one(queue, Cause.NOTIFY)
        self._refresh_timer(queue)

    def chain(self, queues: Iterable[str]) -> None:
        """A claim filled its whole batch, so there may be more: pass the wake-up on."""
        for queue in queues:
            self._wake_one(queue, Cause.CHAIN)

    def poll(self, cause: Cause = Cause.POLL) -> None:
        # The poll is the guarantee behind the hints, so it trusts no earlier claim either.
        self._drained.clear()
        for queue, line in list(self._waiting.items()):
            if line:
                self._wake_one(queue, cause)

    def close(self) -> None:
        self._closing = True
        for timer in self._timers.values():
            if timer is not None:
                timer.cancel()
        self._timers.clear()
        for line in list(self._waiting.values()):
            for waiter in list(line):
                if not waiter.future.done():
                    waiter.future.set_result(Cause.SHUTDOWN)
            line.clear()

    def _refresh_timer(self, queue: str) -> None:
        """Read when the queue's next delayed job is due. Every hint asks for this (it may
        announce a delayed job), so a busy queue reads it at most every
        TIMER_REFRESH_SECONDS, once more after the last hint."""
        if self._closing:
            return
        if queue in self._timer_refreshing:
            self._timer_stale.add(queue)
            return
        self._timer_refreshing.add(queue)
        asyncio.get_running_loop().create_task(self._set_timer(queue))

    async def _set_timer(self, queue: str) -> None:
        try:
            seconds = await self._due_in(queue)
        except Exception:
            # The fallback poll still covers this queue; say so once per failure.
            log.warning("could not read the next due time of queue %s", queue, exc_info=True)
            seconds = None
        loop = asyncio.get_running_loop()
        loop.call_later(TIMER_REFRESH_SECONDS, self._timer_refreshed, queue)
        if self._closing:
            return
        old = self._timers.pop(queue, None)
        if old is not None:
            old.cancel()
        self._timers[queue] = (
            None
            if seconds is None
            else loop.call_later(max(seconds, 0.0), self._timer_fired, queue)
        )

    def _timer_refreshed(self, queue: str) -> None:
        self._timer_refreshing.discard(queue)
        if queue in self._timer_stale:
            self._timer_stale.discard(queue)
            self._refresh_timer(queue)

    def _timer_fired(self, queue: str) -> None:
        self._timers.pop(queue, None)
        self._touch(queue)
        self._wake_one(queue, Cause.TIMER)
        # Unknown until a waiter asks again; a queue nobody waits on needs no timer.
        if self._waiting.get(queue):
            self._refresh_timer(queue)


async def poll_forever(wakeups: Wakeups, interval: float = POLL_SECONDS) -> None:
    """The guarantee behind the hints: every queue with waiters gets a claim attempt at
    least this often."""
    while not wakeups.closing:
        await asyncio.sleep(interval)
        wakeups.poll()
