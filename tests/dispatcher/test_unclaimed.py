"""Jobs that no worker claims are reported (a WARNING and a gauge) instead of waiting in
silence; jobs that wait for a reason (a paused queue, their FIFO group) are not."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import aiohttp
import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from evora.config import Settings
from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import Failure, JobStore
from evora.storage.limits import LimitSpec, LimitStore, Rate
from evora_services.dispatcher import unclaimed
from evora_services.dispatcher.app import create_app
from evora_services.dispatcher.unclaimed import UnclaimedWatch
from tests.polling import until
from tests.servers import serve

LONG_AGO = datetime.now(UTC) - timedelta(hours=1)
GAUGE = "evora_dispatcher_unclaimed_jobs"


async def _submit(store: JobStore, queue: str, type: str, **fields: object) -> str:
    submission = JobSubmission.model_validate(
        {"queue": queue, "type": type, "run_at": LONG_AGO, **fields}
    )
    return str((await store.submit(submission)).job["id"])


async def test_unclaimed_types_are_reported_until_claimed(
    store: JobStore, pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    orphan = await _submit(store, "mail", "mail.typo")
    await _submit(store, "mail", "mail.typo")
    await _submit(store, "mail", "mail.fresh", run_at=datetime.now(UTC))
    await _submit(store, "held", "held.job")
    await store.pause("held")
    await _submit(store, "fifo", "fifo.step", group_key="g")
    await _submit(store, "fifo", "fifo.step", group_key="g")
    [running] = await store.claim(worker_id="w", queues=["fifo"], max_jobs=1)
    registry = CollectorRegistry()
    watch = UnclaimedWatch(pool, registry, after_seconds=60)

    with caplog.at_level(logging.INFO, logger="evora_services.dispatcher.unclaimed"):
        found = await watch.check()
        assert [(u.queue, u.type, u.pending) for u in found] == [("mail", "mail.typo", 2)]
        assert registry.get_sample_value(GAUGE, {"queue": "mail", "type": "mail.typo"}) == 2
        [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert "2 PENDING job(s) of type mail.typo in queue mail" in warning.getMessage()
        assert "is a worker with a handler for mail.typo on queue mail running" in (
            warning.getMessage()
        )

        caplog.clear()
        await watch.check()  # still starving: the gauge stays, no second warning
        assert not [r for r in caplog.records if r.levelno == logging.WARNING]

        claimed = await store.claim(worker_id="w", queues=["mail"], max_jobs=2)
        assert {str(job["id"]) for job in claimed} >= {orphan}
        assert await watch.check() == []
        assert registry.get_sample_value(GAUGE, {"queue": "mail", "type": "mail.typo"}) is None
        assert "jobs of type mail.typo in queue mail are being claimed again" in caplog.text
    assert running["queue"] == "fifo"


async def test_jobs_held_back_by_a_limit_are_not_unclaimed(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    limits = LimitStore(pool)
    await limits.put("api:busy", LimitSpec(concurrency=1, rate=None))
    await limits.put("api:slow", LimitSpec(concurrency=None, rate=Rate(1, 3600)))
    await limits.put("queue:capped", LimitSpec(concurrency=1, rate=None))
    await limits.put("api:idle", LimitSpec(concurrency=5, rate=None))
    for queue, keys in (("busy", ["api:busy"]), ("slow", ["api:slow"]), ("capped", [])):
        for _ in range(3):
            await _submit(store, queue, f"{queue}.job", limit_keys=keys)
        # one runs (or took the bucket's only token); the rest wait for the limit
        assert len(await store.claim(worker_id="w", queues=[queue], max_jobs=3)) == 1
    # a key with room left: its job waits for a worker, and is reported
    await _submit(store, "idle", "idle.job", limit_keys=["api:idle"])

    found = await UnclaimedWatch(pool, CollectorRegistry(), after_seconds=60).check()
    assert [(u.queue, u.type, u.pending) for u in found] == [("idle", "idle.job", 1)]


async def test_jobs_of_a_key_an_upstream_drains_are_not_unclaimed(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """An upstream's retry-after drains a key limited by concurrency alone: its due jobs wait
    for the drain to end, not for a worker."""
    await LimitStore(pool).put("api:upstream", LimitSpec(concurrency=5, rate=None))
    for _ in range(3):
        await _submit(store, "drained", "drained.job", limit_keys=["api:upstream"])
    [job] = await store.claim(worker_id="w", queues=["drained"], max_jobs=1)
    drain = Failure(
        job["id"], job["lease_token"], "429", retry_in_seconds=600, retry_after_key="api:upstream"
    )
    await store.fail(drain)
    assert await UnclaimedWatch(pool, CollectorRegistry(), after_seconds=60).check() == []


async def test_the_dispatcher_serves_the_gauge(db_url: str, store: JobStore) -> None:
    await _submit(store, "mail", "mail.typo")
    settings = Settings(database_url=db_url, auth="disabled", unclaimed_warning_seconds=10)
    dispatcher = await serve(await create_app(settings), "dispatcher", handler_cancellation=True)
    try:
        async with aiohttp.ClientSession() as http:

            async def reported() -> bool:
                async with http.get(dispatcher.url + "/metrics") as response:
                    text = await response.text()
                return f'{GAUGE}{{queue="mail",type="mail.typo"}} 1.0' in text

            await until(reported, "the dispatcher reports the unclaimed job", within=30)
    finally:
        await dispatcher.close()


async def test_a_queue_with_more_due_jobs_than_looked_at_is_reported_as_at_least(
    store: JobStore,
    pool: asyncpg.Pool,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check looks at each queue's first LOOKED_AT_PER_QUEUE long-due jobs in claim order
    (here 3): a queue with more says its count is a lower bound, one within it an exact one;
    a type whose jobs all wait behind that many others is not seen yet."""
    monkeypatch.setattr(unclaimed, "LOOKED_AT_PER_QUEUE", 3)
    for type_ in ("big.a", "big.a", "big.b", "big.b", "big.c"):
        await _submit(store, "big", type_)
    await _submit(store, "small", "small.job")
    with caplog.at_level(logging.WARNING, logger="evora_services.dispatcher.unclaimed"):
        found = await UnclaimedWatch(pool, CollectorRegistry(), after_seconds=60).check()
    assert [(u.queue, u.type, u.pending, u.at_least) for u in found] == [
        ("big", "big.a", 2, True),
        ("big", "big.b", 1, True),
        ("small", "small.job", 1, False),
    ]
    warned = {r.getMessage().split(" in queue ")[0] for r in caplog.records}
    assert warned == {
        "at least 2 PENDING job(s) of type big.a",
        "at least 1 PENDING job(s) of type big.b",
        "1 PENDING job(s) of type small.job",
    }
