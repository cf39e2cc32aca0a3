"""Outcome batching, against an in-process `send` function (no HTTP)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import pytest

import evora
from evora.sdk._http import Transport
from evora.sdk.acks import Ack, AckBatcher
from evora.sdk.reports import Reports
from tests.sdk.conftest import FAST

# What is awaited here needs no I/O and is immediate: the bound fails a hang, or an outcome
# held for the 10 s linger (LINGER), yet is loose enough for a loaded machine's scheduling.
LINGER = 10.0
HANG = LINGER / 2


def ack(n: int) -> Ack:
    return Ack(f"job-{n}", f"token-{n}", "fail", error={"message": "m", "retryable": True})


class Dispatcher:
    """Records batches; `gate`, while clear, holds each send in flight."""

    def __init__(self, failures: Sequence[Exception] = ()) -> None:
        self.batches: list[list[str]] = []
        self.failures = list(failures)
        self.gate = asyncio.Event()
        self.gate.set()
        self.sending = asyncio.Event()

    async def send(self, acks: Sequence[Ack]) -> Mapping[str, int]:
        self.batches.append([a.job_id for a in acks])
        self.sending.set()
        await self.gate.wait()
        if self.failures:
            raise self.failures.pop(0)
        return {a.job_id: 200 for a in acks}


def batcher(
    dispatcher: Dispatcher, *, busy: bool, linger: float = LINGER, max_batch: int = 100
) -> AckBatcher:
    acks = AckBatcher(
        dispatcher.send,
        max_batch=max_batch,
        linger=linger,
        expect_more=lambda: busy,
        backoff=FAST,
    )
    acks.start()
    return acks


async def test_a_lone_outcome_is_sent_at_once_whatever_the_linger() -> None:
    dispatcher = Dispatcher()
    acks = batcher(dispatcher, busy=False, linger=LINGER)
    assert await asyncio.wait_for(acks.submit(ack(1)), HANG) == 200
    assert dispatcher.batches == [["job-1"]]
    await acks.close(within=HANG)


async def test_while_handlers_run_outcomes_linger_until_the_batch_is_full() -> None:
    dispatcher = Dispatcher()
    acks = batcher(dispatcher, busy=True, linger=LINGER, max_batch=3)
    futures = [acks.submit(ack(n)) for n in range(3)]
    assert await asyncio.wait_for(asyncio.gather(*futures), HANG) == [200, 200, 200]
    assert dispatcher.batches == [["job-0", "job-1", "job-2"]]
    await acks.close(within=HANG)


async def test_linger_is_bounded() -> None:
    dispatcher = Dispatcher()
    acks = batcher(dispatcher, busy=True, linger=0.05)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(acks.submit(ack(1)), HANG)
    assert 0.04 <= loop.time() - started < 0.5
    await acks.close(within=HANG)


async def test_outcomes_arriving_during_a_send_go_together_in_the_next_one() -> None:
    dispatcher = Dispatcher()
    dispatcher.gate.clear()
    acks = batcher(dispatcher, busy=False)
    first = acks.submit(ack(0))
    await asyncio.wait_for(dispatcher.sending.wait(), HANG)
    rest = [acks.submit(ack(n)) for n in range(1, 6)]
    dispatcher.gate.set()
    await asyncio.wait_for(asyncio.gather(first, *rest), HANG)
    assert dispatcher.batches == [["job-0"], ["job-1", "job-2", "job-3", "job-4", "job-5"]]
    await acks.close(within=HANG)


async def test_batches_never_exceed_max_batch() -> None:
    dispatcher = Dispatcher()
    dispatcher.gate.clear()
    acks = batcher(dispatcher, busy=False, max_batch=2)
    futures = [acks.submit(ack(n)) for n in range(5)]
    dispatcher.gate.set()
    await asyncio.wait_for(asyncio.gather(*futures), HANG)
    assert [len(batch) for batch in dispatcher.batches] == [2, 2, 1]
    await acks.close(within=HANG)


async def test_transient_failures_are_retried_with_the_same_batch() -> None:
    dispatcher = Dispatcher(
        failures=[
            evora.EvoraConnectionError("reset", request_sent=True),
            evora.ServerError(503, code="http_503", title="Service Unavailable"),
        ]
    )
    acks = batcher(dispatcher, busy=False)
    assert await asyncio.wait_for(acks.submit(ack(1)), HANG) == 200
    assert dispatcher.batches == [["job-1"]] * 3
    await acks.close(within=HANG)


async def test_a_final_error_is_handed_to_every_waiting_job() -> None:
    refused = evora.UnauthorizedError(401, code="unauthorized", title="Unauthorized")
    dispatcher = Dispatcher(failures=[refused])
    dispatcher.gate.clear()
    acks = batcher(dispatcher, busy=False)
    futures = [acks.submit(ack(n)) for n in range(2)]
    dispatcher.gate.set()
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert results == [refused, refused]
    await acks.close(within=HANG)


async def test_close_gives_up_on_what_cannot_be_sent(caplog: pytest.LogCaptureFixture) -> None:
    down = [evora.EvoraConnectionError("refused", request_sent=False)] * 1000
    dispatcher = Dispatcher(failures=down)
    acks = batcher(dispatcher, busy=False)
    future = acks.submit(ack(1))
    await asyncio.wait_for(dispatcher.sending.wait(), HANG)
    with caplog.at_level(logging.ERROR, logger="evora.worker"):
        await acks.close(within=0.1)
    with pytest.raises(evora.EvoraConnectionError, match="stopped"):
        await future
    assert "1 job outcomes could not be reported" in caplog.text


def test_ack_wire_shapes() -> None:
    done = Ack("j", "t", "complete", result=orjson.Fragment(b'{"ok":true}'))
    assert orjson.loads(orjson.dumps(done.item())) == {
        "id": "j",
        "outcome": "complete",
        "lease_token": "t",
        "result": {"ok": True},
    }
    assert ack(1).endpoint_body() == {
        "lease_token": "token-1",
        "error": {"message": "m", "retryable": True},
    }


@pytest.mark.parametrize(
    ("status", "level", "says"),
    [
        (409, logging.WARNING, "taken away"),
        (404, logging.WARNING, "no longer exists"),
        (500, logging.ERROR, "answered 500"),
    ],
)
async def test_a_refused_outcome_is_logged_naming_its_job(
    status: int, level: int, says: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The job's task awaits the batcher's future itself; the answer is read and logged where
    # the batch is sent, out of that task's log context, so the record names the job itself.
    def carry(acks: Sequence[Ack]) -> asyncio.Future[list[dict[str, Any]]]:
        answer: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
        answer.set_result(
            [{"id": a.job_id, "status": 200 if a.job_id == "job-1" else status} for a in acks]
        )
        return answer

    reports = Reports(
        Transport("http://127.0.0.1:9", None, timeout=1.0, retries=0, backoff=FAST),
        max_batch=10,
        linger=0.0,
        expect_more=lambda: False,
        backoff=FAST,
        carry=carry,
    )
    reports.start()
    with caplog.at_level(logging.WARNING, logger="evora.worker"):
        statuses = await asyncio.wait_for(
            asyncio.gather(reports.report(ack(1)), reports.report(ack(2))), HANG
        )
    await reports.close(within=HANG)
    assert list(statuses) == [200, status]
    [record] = caplog.records
    assert (record.levelno, record.__dict__["job_id"]) == (level, "job-2")
    assert says in record.getMessage()
