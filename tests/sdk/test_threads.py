"""The daemon threads plain `def` handlers run in."""

from __future__ import annotations

import contextvars
import threading
import time
from concurrent.futures import CancelledError

import pytest

from evora.sdk.threads import HandlerThreads

WHO = contextvars.ContextVar("WHO", default="nobody")


def test_at_most_size_calls_run_at_once_and_the_rest_wait_their_turn() -> None:
    threads = HandlerThreads(2, name="t")
    gate = threading.Event()
    lock = threading.Lock()
    running: list[int] = []
    most = 0

    def call() -> str:
        nonlocal most
        with lock:
            running.append(1)
            most = max(most, len(running))
        gate.wait(10)
        with lock:
            running.pop()
        current = threading.current_thread()
        assert current.daemon
        return current.name

    futures = [threads.submit(call) for _ in range(6)]
    try:
        deadline = time.monotonic() + 10
        while sum(f.running() for f in futures) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # room for a third that must not start
        assert [f.running() or f.done() for f in futures].count(True) == 2
    finally:
        gate.set()
    names = {f.result(10) for f in futures}
    assert most == 2
    assert names <= {"t-0", "t-1"}
    threads.close()


def test_a_call_sees_the_callers_context_and_hands_back_its_exception() -> None:
    threads = HandlerThreads(1, name="t")
    WHO.set("the job")

    def fails() -> None:
        raise ValueError(WHO.get())

    assert threads.submit(WHO.get).result(10) == "the job"
    with pytest.raises(ValueError, match="the job"):
        threads.submit(fails).result(10)
    threads.close()


def test_a_call_cancelled_while_it_waits_never_runs_and_close_ends_idle_threads() -> None:
    threads = HandlerThreads(1, name="closing")
    gate = threading.Event()
    ran: list[str] = []
    first = threads.submit(lambda: gate.wait(10))
    second = threads.submit(lambda: ran.append("second"))
    assert second.cancel()
    gate.set()
    assert first.result(10) is True
    with pytest.raises(CancelledError):
        second.result(10)
    assert ran == []

    threads.close()
    for thread in threading.enumerate():
        if thread.name.startswith("closing-"):
            thread.join(10)
            assert not thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        threads.submit(lambda: None)
