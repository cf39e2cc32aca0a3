"""The dispatcher's fair-scheduling gauges (docs/metrics.md) on a real PostgreSQL: per fair
queue and kind of fairness key, keys with work, jobs waiting and for how long, lease seconds
held."""

from __future__ import annotations

import asyncpg
from prometheus_client import CollectorRegistry

from evora.protocol.jobs import JobSubmission
from evora.storage.fairness import FairnessStore, KindService
from evora.storage.jobs import JobStore
from evora_services.dispatcher import fairness as watch_module
from evora_services.dispatcher.fairness import FairnessWatch
from tests.conftest import Clock


def _value(registry: CollectorRegistry, name: str, kind: str) -> float | None:
    return registry.get_sample_value(name, {"queue": "m", "kind": kind})


async def test_gauges_per_kind_follow_the_fair_queue(
    pool: asyncpg.Pool, store: JobStore, clock: Clock
) -> None:
    registry = CollectorRegistry()
    watch = FairnessWatch(FairnessStore(pool), registry)
    assert await watch.check() == {}  # no fair queue: nothing exported
    await store.submit_batch(
        [JobSubmission(queue="m", type="t", fairness_key=f"tenant:{n % 3}") for n in range(6)]
        + [JobSubmission(queue="m", type="t", fairness_key="solo")]
    )
    [job] = await store.claim(worker_id="w", queues=["m"], max_jobs=1)
    await clock.advance(20)
    await store.complete(job["id"], job["lease_token"])
    await store.claim(worker_id="w", queues=["m"], max_jobs=1)  # folds the ending
    await watch.check()
    assert _value(registry, "evora_fair_backlogged_keys", "tenant") == 3
    assert _value(registry, "evora_fair_waiting_jobs", "tenant") == (
        5 if job["fairness_key"] == "solo" else 4
    )
    assert _value(registry, "evora_fair_waiting_seconds", "tenant") >= 20  # type: ignore[operator]
    held = _value(registry, "evora_fair_held_seconds", job["fairness_key"].split(":")[0])
    assert held is not None and held >= 20


def test_pairs_beyond_the_cap_are_summed_per_queue() -> None:
    many = [
        KindService("q", f"k{n:03}", 1, 2, float(n), 1.5, 3)
        for n in range(watch_module.MAX_SERIES + 3)
    ]
    capped = watch_module._capped(many)
    assert len(capped) == watch_module.MAX_SERIES + 1
    other = capped[("q", watch_module.OTHER)]
    assert (other.backlogged_keys, other.waiting_jobs, other.held_seconds) == (3, 6, 4.5)
    assert other.waiting_seconds == watch_module.MAX_SERIES + 2
