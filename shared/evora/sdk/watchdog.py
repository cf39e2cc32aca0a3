"""Noticing an event loop that something blocks.

Everything a worker does for all of its jobs (heartbeats, claims, outcome reports) runs on
one event loop. An `async` handler that blocks it (`time.sleep`, a blocking client, heavy
CPU work) stalls all of that: leases expire under every job of the worker, and the jobs run
again elsewhere while their first run is still going. Nothing on the loop can notice while
it is blocked, so a thread watches: the loop stamps the time every fraction of the
threshold, and when the stamp is older than the threshold the thread names the task the
loop is running (and the line it is in) in a warning; once the loop runs again it says for
how long it was blocked in all.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("evora.worker")

# How often, as a fraction of the threshold, the loop stamps the time and the thread looks.
_CHECKS_PER_THRESHOLD = 4

Describe = Callable[["asyncio.Task[Any] | None"], str]


@dataclass(frozen=True, slots=True)
class _Block:
    since: float  # monotonic time of the loop's last stamp before it blocked
    culprit: str


class LoopWatchdog:
    """Warns on the `evora.worker` logger when `loop` has not run for `threshold` seconds.

    `describe` turns the task the loop was running (None if it was not running a task) into
    words for the warning, e.g. which job's handler that is. `start()` and `stop()` are
    called on the loop's own thread."""

    def __init__(self, threshold: float, describe: Describe) -> None:
        if threshold <= 0:
            raise ValueError("the blocked-loop threshold must be positive")
        self._threshold = threshold
        self._period = threshold / _CHECKS_PER_THRESHOLD
        self._describe = describe
        self._lock = threading.Lock()
        self._stamp = time.monotonic()
        self._block: _Block | None = None
        self._stopped = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._timer: asyncio.TimerHandle | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._stamp = time.monotonic()
        self._timer = self._loop.call_later(self._period, self._tick)
        self._thread = threading.Thread(target=self._watch, name="evora-loop-watchdog")
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._timer is not None:
            self._timer.cancel()

    def _tick(self) -> None:
        """On the loop: stamp the time, and report the end of a block the thread saw."""
        now = time.monotonic()
        with self._lock:
            self._stamp = now
            block, self._block = self._block, None
        if block is not None:
            log.warning(
                "the event loop ran again after being blocked for %.1fs by %s",
                now - block.since,
                block.culprit,
            )
        assert self._loop is not None
        self._timer = self._loop.call_later(self._period, self._tick)

    def _watch(self) -> None:
        """In the watchdog thread: look at the stamp every period."""
        while not self._stopped.wait(self._period):
            with self._lock:
                since, reported = self._stamp, self._block is not None
            stalled = time.monotonic() - since
            if reported or stalled < self._threshold:
                continue
            culprit = self._culprit()
            with self._lock:
                if self._stamp != since:
                    continue  # the loop ran meanwhile: it was a close call, not a block
                self._block = _Block(since, culprit)
            log.warning(
                "the event loop has been blocked for %.1fs by %s; while it is blocked no job "
                "of this worker heartbeats, so leases expire and jobs run twice. A handler "
                "that blocks must be a plain `def` (the worker runs it in a thread), or move "
                "the blocking calls into `await asyncio.to_thread(...)`",
                stalled,
                culprit,
            )

    def _culprit(self) -> str:
        assert self._loop is not None
        # Read from this thread: the loop's current task is a plain dict entry, and the
        # blocked thread's innermost frame says where exactly it is stuck.
        described = self._describe(asyncio.current_task(self._loop))
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return described
        where = traceback.extract_stack(frame, limit=1)[-1]
        return f"{described} (at {where.filename}:{where.lineno} in {where.name})"
