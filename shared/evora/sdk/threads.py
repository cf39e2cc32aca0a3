"""The threads a worker runs its plain `def` handlers in.

Like `concurrent.futures.ThreadPoolExecutor` (bounded, threads started on demand), with one
difference that matters here: the threads are daemon threads. A thread cannot be stopped
from outside, and a handler may never return; the executor's threads are joined when the
interpreter exits, so one stuck handler would keep a stopped worker process alive forever.
A daemon thread still running at exit is simply dropped, as a cancelled async handler is.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

_Work = tuple[Future[Any], contextvars.Context, Callable[[], Any]]


class HandlerThreads:
    """At most `size` daemon threads named `name-N`, each running one call at a time; calls
    beyond that wait in a queue. Each call runs in the context of the caller (a copy), so
    what the caller bound for logging (the job id) is bound in the thread too."""

    def __init__(self, size: int, name: str) -> None:
        if size < 1:
            raise ValueError("a thread pool needs at least one thread")
        self._size = size
        self._name = name
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._closed = False

    @property
    def size(self) -> int:
        return self._size

    def submit(self, call: Callable[[], T]) -> Future[T]:
        """Run `call()` in one of the threads; its future is done when it returns or raises.
        A future cancelled while it still waits for a thread is skipped."""
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("these handler threads are closed")
            self._work.put((future, contextvars.copy_context(), call))
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._serve, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        return future

    def close(self) -> None:
        """Idle threads end now, busy ones when their call returns; nothing more may be
        submitted. Returns at once: it does not wait for any call."""
        with self._lock:
            self._closed = True
            for _ in self._threads:
                self._work.put(None)

    def _serve(self) -> None:
        while (work := self._work.get()) is not None:
            future, context, call = work
            if future.set_running_or_notify_cancel():
                try:
                    result = context.run(call)
                except BaseException as exc:  # handed to whoever awaits the future
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            del work, future, context, call  # nothing of a finished call stays alive
            with self._lock:
                self._idle += 1


def when_thread_done(thread: Future[Any], callback: Callable[[], object]) -> None:
    """Call `callback` on the running event loop once the handler `thread` has returned;
    nothing if the loop is closed by then (the worker is gone)."""
    loop = asyncio.get_running_loop()

    def done(_: Future[Any]) -> None:
        # In the handler thread.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(callback)

    thread.add_done_callback(done)
