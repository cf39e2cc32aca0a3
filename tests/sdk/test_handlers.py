"""The handler registry, the Job a handler gets, and how exceptions become fail reports."""

from __future__ import annotations

import asyncio
import functools
import gc
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import pytest

import evora
from evora.protocol.bounds import MAX_ERROR_MESSAGE, MAX_ERROR_TRACEBACK
from evora.sdk.handlers import runs_on_loop
from evora.sdk.running import failure_from_exception


async def noop(job: evora.Job) -> None:
    return None


def test_decorator_registers_by_type_and_returns_the_function() -> None:
    handlers = evora.Handlers()

    @handlers.job("email.send")
    async def send(job: evora.Job) -> str:
        return "sent"

    assert handlers.get("email.send") is send
    assert handlers.get("other") is None
    assert handlers.types == ["email.send"]


def test_registering_twice_is_an_error_unless_it_is_the_same_function() -> None:
    handlers = evora.Handlers()
    handlers.add("t", noop)
    handlers.add("t", noop)

    async def other(job: evora.Job) -> None:
        return None

    with pytest.raises(ValueError, match="already registered"):
        handlers.add("t", other)


def test_plain_functions_register_too_but_generators_and_bad_types_do_not() -> None:
    handlers = evora.Handlers()

    @handlers.job("sync")
    def sync(job: evora.Job) -> str:
        return "done"

    assert handlers.get("sync") is sync
    assert not runs_on_loop(sync)
    assert runs_on_loop(noop)
    assert runs_on_loop(functools.partial(noop))

    def generator(job: evora.Job) -> Iterator[int]:
        yield 1

    async def async_generator(job: evora.Job) -> AsyncIterator[int]:
        yield 1

    for bad in (generator, async_generator):
        with pytest.raises(TypeError, match="not yield"):
            handlers.add("t", bad)
    with pytest.raises(TypeError, match="must be a function"):
        handlers.add("t", "not callable")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="invalid job type"):
        handlers.add("has space", noop)


def test_include_merges_registries() -> None:
    a, b = evora.Handlers(), evora.Handlers()
    a.add("a", noop)
    b.add("b", noop)
    a.include(b)
    assert a.types == ["a", "b"]


def test_worker_decorator_uses_its_registry() -> None:
    worker = evora.Worker("http://127.0.0.1:1", "t", ["q"])

    @worker.handler("x.y")
    async def handle(job: evora.Job) -> None:
        return None

    assert worker.handlers.get("x.y") is handle


def claimed(**overrides: Any) -> dict[str, Any]:
    data = {
        "id": "0b8f4c1e-0000-4000-8000-000000000001",
        "queue": "q",
        "type": "t",
        "payload": {"n": 1},
        "attempt": 2,
        "max_attempts": 5,
        "lease_seconds": 30,
        "lease_token": "tok",
        "priority": 3,
    }
    return {**data, **overrides}


def test_job_from_a_claimed_job() -> None:
    job = evora.Job.from_claim(claimed())
    assert (job.id, job.queue, job.type, job.payload) == (claimed()["id"], "q", "t", {"n": 1})
    assert (job.attempt, job.max_attempts, job.lease_seconds, job.lease_token) == (2, 5, 30, "tok")
    assert job.data["priority"] == 3
    assert not job.cancel_requested
    job.raise_if_cancel_requested()
    job.cancel_event.set()
    assert job.cancel_requested
    with pytest.raises(evora.JobCancelled):
        job.raise_if_cancel_requested()


def test_progress_keeps_the_newest_unsent_report() -> None:
    job = evora.Job.from_claim(claimed())
    job.progress({"done": 1})
    job.progress({"done": 2})
    sent = job._take_progress()
    assert sent is not None and orjson.loads(orjson.dumps(sent)) == {"done": 2}
    assert job._take_progress() is None
    job.progress({"done": 3})
    job._restore_progress(sent)  # a failed heartbeat must not overwrite a newer report
    newer = job._take_progress()
    assert newer is not None and orjson.loads(orjson.dumps(newer)) == {"done": 3}
    with pytest.raises(TypeError):
        job.progress(object())


def test_threads_asking_for_the_cancel_event_at_once_get_the_same_one() -> None:
    # Created when first asked for: a handler thread and the loop must not each make one,
    # or a cancel request set on one would go unseen on the other.
    job = evora.Job.from_claim(claimed())
    start = threading.Barrier(8)

    def ask() -> asyncio.Event:
        start.wait()
        return job.cancel_event

    with ThreadPoolExecutor(8) as pool:
        events = list(pool.map(lambda _: ask(), range(8)))
    assert all(event is events[0] for event in events)
    assert not job.cancel_requested
    events[0].set()
    assert job.cancel_requested


def test_a_claimed_job_is_one_object_for_the_garbage_collector() -> None:
    # A drain builds a thousand jobs a second; every container the collector tracks brings
    # its next young collection nearer. The cancel event (with its queue of waiters) waits
    # until someone asks for it, the progress lock is shared: 4 objects per job before.
    data = [claimed(id=str(i)) for i in range(1000)]
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        jobs = [evora.Job.from_claim(item) for item in data]
        tracked = len(gc.get_objects()) - before - 1  # less the list holding them
    finally:
        gc.enable()
    assert all(not job.cancel_requested for job in jobs)
    assert tracked / len(jobs) <= 1.5


class Fatal(Exception):
    retryable = False


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_failures_are_retryable_unless_the_exception_says_otherwise() -> None:
    failure = failure_from_exception(_raised(ValueError("bad")))
    assert failure.pop("traceback").endswith("raise exc\nValueError: bad\n")
    assert failure == {"message": "bad", "type": "ValueError", "retryable": True}
    assert failure_from_exception(evora.NonRetryable("never"))["retryable"] is False
    failure = failure_from_exception(Fatal("x"))
    assert failure.pop("traceback") == "tests.sdk.test_handlers.Fatal: x\n"
    assert failure == {"message": "x", "type": "Fatal", "retryable": False}


def test_failure_message_is_never_empty_nor_huge() -> None:
    assert failure_from_exception(TimeoutError())["message"] == "TimeoutError"
    assert len(failure_from_exception(ValueError("x" * 100_000))["message"]) == MAX_ERROR_MESSAGE


def test_failure_trace_keeps_its_end_within_the_limit() -> None:
    try:
        try:
            raise ValueError("x" * 100_000)  # a cause with a huge message: a huge trace
        except ValueError as cause:
            raise LookupError("at the bottom") from cause
    except LookupError as exc:
        trace = failure_from_exception(exc)["traceback"]
    assert len(trace) == MAX_ERROR_TRACEBACK
    assert trace.endswith(
        'raise LookupError("at the bottom") from cause\nLookupError: at the bottom\n'
    )
