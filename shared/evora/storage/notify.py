"""NOTIFY hints that wake dispatchers (rule 7: a hint, never the guarantee).

Every notifying commit takes a cluster-wide lock, so a process sends at most one
`pg_notify` per queue per `DEBOUNCE_SECONDS`. Writers pass `suppressed()` into their
statement, which notifies only the queues not in it, and report back what it notified.
A dispatcher woken by a hint claims again once the debounce window has passed, so a job
committed inside a suppressed window is still picked up at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

JOBS_CHANNEL = "evora_jobs"
DEBOUNCE_SECONDS = 0.05


class NotifyDebouncer:
    def __init__(self, interval: float = DEBOUNCE_SECONDS) -> None:
        self._interval = interval
        self._last: dict[str, float] = {}

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
