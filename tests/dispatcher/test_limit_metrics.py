"""The dispatcher's flow-control gauges (docs/metrics.md) on a real PostgreSQL: per kind of
key, jobs running under limits, tokens, jobs held back and for how long."""

from __future__ import annotations

import asyncpg
from prometheus_client import CollectorRegistry

from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import JobStore
from evora.storage.limits import KindUsage, LimitSpec, LimitStore, Rate
from evora_services.dispatcher import limits as watch_module
from evora_services.dispatcher.limits import LimitWatch
from tests.conftest import Clock


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


def test_kinds_beyond_the_cap_are_summed() -> None:
    many = [KindUsage(f"k{n:03}", 1, None, 2, float(n)) for n in range(watch_module.MAX_KINDS + 3)]
    capped = watch_module._capped(many)
    assert len(capped) == watch_module.MAX_KINDS + 1
    other = capped[watch_module.OTHER]
    assert (other.running, other.throttled_jobs, other.tokens) == (3, 6, None)
    assert other.throttled_seconds == watch_module.MAX_KINDS + 2
