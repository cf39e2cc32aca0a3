"""Workers name queues freely: claims and hints for thousands of distinct queue names must
leave no per-queue state or metric series behind once nobody waits on those queues."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
from prometheus_client import CollectorRegistry

from evora.storage.notify import JOBS_CHANNEL
from evora_services.dispatcher.metrics import OTHER_QUEUES, QueueLabels, WaitingPolls
from tests.dispatcher.conftest import Dispatcher
from tests.polling import until

CLAIMS = 400
QUEUES_PER_CLAIM = 20  # the most a claim may name
HINTED_QUEUES = 2_000
# /metrics of an idle dispatcher is about 7 KB; with a series per queue ever named it was
# 630 KB after this test.
METRICS_BYTES_BOUND = 32 * 1024


def random_queues() -> list[str]:
    return [f"q{uuid.uuid4().hex}" for _ in range(QUEUES_PER_CLAIM)]


async def test_state_and_series_of_queues_nobody_waits_on_go_away(
    dispatcher: Dispatcher, pool: asyncpg.Pool
) -> None:
    await until(lambda: dispatcher.metric("evora_dispatcher_listener_connected") == 1)
    limit = asyncio.Semaphore(20)

    async def claim() -> None:
        async with limit:
            body = {"worker_id": "w", "queues": random_queues(), "wait_seconds": 0.05}
            status, answer = await dispatcher.post("/v1/claim", body)
            assert status == 200 and answer == {"jobs": []}

    await asyncio.gather(*(claim() for _ in range(CLAIMS)))
    await pool.execute(
        "SELECT pg_notify($1, 'h' || n) FROM generate_series(1, $2) AS n",
        JOBS_CHANNEL,
        HINTED_QUEUES,
    )
    wakeups = dispatcher.state.wakeups
    # the hints arrive, then the next fallback poll forgets what nobody waits on
    await until(lambda: wakeups.hints([f"h{HINTED_QUEUES}"]) > 0)

    async with dispatcher.http.get(dispatcher.url + "/metrics") as response:
        exported = await response.read()
    assert len(exported) < METRICS_BYTES_BOUND, len(exported)
    await until(lambda: not any(wakeups.footprint().values()), within=15)


def test_a_counter_labels_the_first_queues_and_counts_the_rest_as_other() -> None:
    labels = QueueLabels(limit=3)
    assert [labels(q) for q in ("a", "b", "a", "c", "d", "e", "b")] == [
        "a",
        "b",
        "a",
        "c",
        OTHER_QUEUES,
        OTHER_QUEUES,
        "b",
    ]


def test_waiting_polls_export_the_busiest_queues_while_waited_on() -> None:
    registry = CollectorRegistry()
    waiting = WaitingPolls(limit=2)
    registry.register(waiting)
    for queues in (["a", "b"], ["a"], ["a", "c"], ["d"], ["b"]):
        waiting.enter(queues)

    def series() -> dict[str, float]:
        return {
            s.labels["queue"]: s.value
            for m in registry.collect()
            for s in m.samples
            if m.name == "evora_dispatcher_waiting_polls"
        }

    assert series() == {"a": 3, "b": 2, OTHER_QUEUES: 2}
    for queues in (["a", "b"], ["a"], ["a", "c"], ["d"]):
        waiting.leave(queues)
    assert series() == {"b": 1}
    waiting.leave(["b"])
    assert series() == {}
