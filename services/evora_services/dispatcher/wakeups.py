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

Clients name queues freely, so nothing here may grow with the number of queue names ever
seen: a queue's line goes as soon as its last waiter leaves, and the fallback poll forgets
the timers and hint marks of every queue nobody waits on (a queue waited on again reads its
due time afresh). What a queue costs is bounded by the queues waited on now and those
touched within one poll interval.
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
        # when each queue was last touched by a hint or timer, on one counter that only
        # grows, so a claim can tell whether anything happened since the last claim found
        # the queues drained. Forgotten queues read as `_forgotten`, the newest mark
        # forgotten: possibly later than their own (a claim more), never earlier.
        self._touches = 0
        self._touched: dict[str, int] = {}
        self._forgotten = 0
        # claim shapes whose last claim came back short, with the hints mark before it
        self._drained: dict[ClaimShape, int] = {}
        self._listening = False
        self._closing = False

    @property
    def closing(self) -> bool:
        return self._closing

    def waiting(self) -> dict[str, int]:
        return {q: len(w) for q, w in self._waiting.items()}

    def footprint(self) -> dict[str, int]:
        """How many entries each per-queue or per-shape map holds now."""
        return {
            "waiting": len(self._waiting),
            "timers": len(self._timers),
            "timer_refreshing": len(self._timer_refreshing),
            "timer_stale": len(self._timer_stale),
            "touched": len(self._touched),
            "drained": len(self._drained),
        }

    def register(self, queues: Iterable[str]) -> Waiter:
        """Join the queues' lines *before* claiming, so a hint that arrives during the claim
        is not lost."""
        loop = asyncio.get_running_loop()
        waiter = Waiter(tuple(queues), loop.create_future())
        if self._closing:
            waiter.future.set_result(Cause.SHUTDOWN)
            return waiter
        self._join(waiter)
        return waiter

    def rearm(self, waiter: Waiter) -> None:
        """Wait again after a claim came back empty."""
        if waiter.future.done() and not self._closing:
            waiter.future = asyncio.get_running_loop().create_future()
            self._join(waiter)

    def _join(self, waiter: Waiter) -> None:
        for queue in waiter.queues:
            self._waiting.setdefault(queue, {})[waiter] = None
            if queue not in self._timers:  # unknown, or forgotten while nobody waited
                self._refresh_timer(queue)

    def _remove(self, waiter: Waiter) -> None:
        """Take the waiter out of its lines, dropping lines left empty."""
        for queue in waiter.queues:
            line = self._waiting.get(queue)
            if line is not None:
                line.pop(waiter, None)
                if not line:
                    del self._waiting[queue]

    def leave(self, waiter: Waiter, *, woken_unused: bool) -> None:
        """Leave all lines. A waiter that was woken but did not claim (its client left)
        passes the wake-up on so it is not lost."""
        self._remove(waiter)
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
        while line := self._waiting.get(queue):
            waiter = next(iter(line))
            self._remove(waiter)
            if not waiter.future.done():
                waiter.future.set_result(cause)
                if self._observe is not None:
                    self._observe(queue, cause)
                return True
        return False

    def hints(self, queues: Iterable[str]) -> int:
        """A mark that moves whenever one of `queues` gets a hint."""
        return max((self._touched.get(queue, self._forgotten) for queue in queues), default=0)

    def _touch(self, queue: str) -> None:
        self._touches += 1
        self._touched[queue] = self._touches

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
        if queue not in self._waiting:
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
        # before the wake-ups, which empty lines whose waiters will be back after a claim
        self._forget_unwaited()
        for queue in list(self._waiting):
            self._wake_one(queue, cause)

    def _forget_unwaited(self) -> None:
        """Drop the timers and hint marks of queues nobody waits on. With no drained shape
        left, only a claim running now still holds a mark, and reading a forgotten queue
        as `_forgotten` can only make that claim's next check claim once more."""
        for queue in [q for q in self._timers if q not in self._waiting]:
            timer = self._timers.pop(queue)
            if timer is not None:
                timer.cancel()
        for queue in [q for q in self._touched if q not in self._waiting]:
            self._forgotten = max(self._forgotten, self._touched.pop(queue))

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
        self._waiting.clear()

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
        if queue in self._waiting:
            self._refresh_timer(queue)


async def poll_forever(wakeups: Wakeups, interval: float = POLL_SECONDS) -> None:
    """The guarantee behind the hints: every queue with waiters gets a claim attempt at
    least this often."""
    while not wakeups.closing:
        await asyncio.sleep(interval)
        try:
            wakeups.poll()
        except Exception:
            # Only a bug gets here; the guarantee must outlive it, so the loop goes on.
            log.exception("the fallback poll failed; polling again in %.1fs", interval)
