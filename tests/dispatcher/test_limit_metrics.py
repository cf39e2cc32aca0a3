"""The dispatcher's flow-control gauges (docs/metrics.md) on a real PostgreSQL: per kind of
key, jobs running under limits, tokens, jobs held back and for how long."""

from __future__ import annotations

import asyncpg
from prometheus_client import CollectorRegistry

from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import Failure, JobStore
from evora.storage.limits import KindUsage, LimitSpec, LimitStore, Rate
from evora_services.dispatcher import limits as watch_module
from evora_services.dispatcher.limits import LimitWatch
from tests.conftest import Clock


def _until(registry: CollectorRegistry, key: str) -> float | None:
    return registry.get_sample_value("evora_limit_throttled_until_seconds", {"key": key})


def _value(registry: CollectorRegistry, name: str, kind: str) -> float | None:
    return registry.get_sample_value(name, {"kind": kind})


async def test_gauges_per_kind_follow_the_limits(
    pool: asyncpg.Pool, store: JobStore, clock: Clock
) -> None:
    limits = LimitStore(pool)
    registry = CollectorRegistry()
    watch = LimitWatch(limits, registry)
    await store.submit_batch(
        [JobSubmission(queue="m", type="t", limit_keys=[f"tenant:{n % 2}"]) for n in range(6)]
    )
    assert await watch.check() == {}  # no limit: nothing read, nothing exported

    await limits.put("tenant:*", LimitSpec(concurrency=1, rate=Rate(10, 60.0)))
    claimed = await store.claim(worker_id="w", queues=["m"], max_jobs=10)
    assert len(claimed) == 2
    await clock.advance(30)
    await watch.check()
    assert _value(registry, "evora_limit_running_jobs", "tenant") == 2
    assert _value(registry, "evora_limit_throttled_jobs", "tenant") == 4
    assert _value(registry, "evora_limit_throttled_seconds", "tenant") >= 30  # type: ignore[operator]
    # 9 left in each bucket, 5 refilled in 30 s, capped at 10
    assert _value(registry, "evora_limit_tokens", "tenant") == 20

    await limits.delete("tenant:*")
    await watch.check()
    for name in ("evora_limit_running_jobs", "evora_limit_tokens", "evora_limit_throttled_jobs"):
        assert _value(registry, name, "tenant") is None


async def test_an_upstream_drain_is_shown_by_its_limit_until_it_ends(
    pool: asyncpg.Pool, store: JobStore, clock: Clock
) -> None:
    """evora_limit_throttled_until_seconds has a series per configured limit (a prefix
    limit's for every key under it), only while an upstream throttles a key it governs."""
    limits = LimitStore(pool)
    registry = CollectorRegistry()
    watch = LimitWatch(limits, registry)
    await limits.put("api:*", LimitSpec(concurrency=5, rate=None))
    await store.submit_batch(
        [JobSubmission(queue="m", type="t", limit_keys=[f"api:{n % 2}"]) for n in range(4)]
    )
    jobs = await store.claim(worker_id="w", queues=["m"], max_jobs=2)
    for job, seconds in zip(jobs, (60, 120), strict=True):
        await store.fail(
            Failure(
                job["id"],
                job["lease_token"],
                "429",
                retry_in_seconds=seconds,
                retry_after_key=job["limit_keys"][0],
            )
        )
    now = await pool.fetchval("SELECT evora.clock_now()")
    await watch.check()
    until = _until(registry, "api:*")
    assert until is not None and 119 < until - now.timestamp() <= 120
    assert _until(registry, "api:0") is None  # the keys under the prefix have no series
    # the other job of each key is due and held back by the drain (a concurrency left)
    assert _value(registry, "evora_limit_throttled_jobs", "api") == 2

    await clock.advance(121)
    await watch.check()
    assert _until(registry, "api:*") is None


def test_kinds_beyond_the_cap_are_summed() -> None:
    many = [KindUsage(f"k{n:03}", 1, None, 2, float(n)) for n in range(watch_module.MAX_KINDS + 3)]
    capped = watch_module._capped(many)
    assert len(capped) == watch_module.MAX_KINDS + 1
    other = capped[watch_module.OTHER]
    assert (other.running, other.throttled_jobs, other.tokens) == (3, 6, None)
    assert other.throttled_seconds == watch_module.MAX_KINDS + 2
