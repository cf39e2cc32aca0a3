"""How fairly the claim shares workers among tenants (docs/flow-control.md, "Fairness
keys"), on one durable PostgreSQL, through the job store: adversarial tenant mixes run by
simulated handlers (each job sleeps its tenant's duration) on several concurrent claimers,
with each way of claiming:

- `fair`: every job carries its tenant as `fairness_key` (weights set per key or prefix);
- `fair-limited`: the same, and every job holds one limit key, `upstream`, at a concurrency of
  half the workers that always binds: the limited claim serves the keys by virtual time;
- `round-robin`: today's fairness without keys, the limited claim's round-robin over lanes
  (each job's tenant as its first limit key, under a limit that never binds);
- `fifo`: no keys at all, the unkeyed claim (submission order);

and `ideal`, the weighted share each tenant is entitled to. Per tenant it reports the wait
(claimed minus submitted) p50/p99 and the *contention share*: the worker time it got while
every tenant of the scenario had work waiting, over the time its weight entitles it to (1.0
is exactly fair); per run the worst tenant's share and Jain's index over the shares.

    python -m bench.fairness                    # every scenario, every way, full size
    python -m bench.fairness --quick            # the CI smoke's size (tests/bench)
    python -m bench.fairness --scenario sybil --ways fair,round-robin
    python -m bench.fairness --cost             # the claim with 10,000 active keys vs unkeyed

Scenarios: `flood` (one tenant submits 20x the others' work at once), `sybil` (one tenant
spreads its work over 100 keys; `sybil-weighted`, the same with its prefix weighted 1/100;
`sybil-tenant`, the same tenant keyed as one), `tiers`
(weights 4:2:1 by prefix), `burst` (a tenant sends bursts into another's flood), `slow` (one
tenant's jobs take 10x as long: fair by lease time means equal worker time, not equal
dispatches).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from evora.embedded import LocalPostgres
from evora.protocol.jobs import JobSubmission
from evora.storage.db import create_pool
from evora.storage.fairness import FairnessStore
from evora.storage.jobs import Completion, JobStore
from evora.storage.migrate import apply_migrations

WAYS = ("fair", "fair-limited", "round-robin", "fifo")


# the limit key every job of the `fair-limited` way holds
UPSTREAM = "upstream"


@dataclass(frozen=True)
class Tenant:
    name: str
    jobs: int
    ms: float
    weight: float = 1.0
    # its jobs' fairness keys: the tenant's name, or `keys` keys under it (a sybil)
    keys: int = 1
    # submitted in bursts of `burst` jobs every `every_s` seconds (0: all at the start)
    burst: int = 0
    every_s: float = 0.0

    def key(self, n: int) -> str:
        return self.name if self.keys == 1 else f"{self.name}:{n % self.keys}"


@dataclass(frozen=True)
class Scenario:
    name: str
    tenants: tuple[Tenant, ...]
    # weights by key or prefix, as PUT /v1/fairness/{key} sets them
    weights: dict[str, float] = field(default_factory=dict)


def scenarios(scale: float) -> list[Scenario]:
    def n(jobs: int) -> int:
        return max(4, round(jobs * scale))

    return [
        Scenario(
            "flood",
            (Tenant("flood", n(800), 10), Tenant("light1", n(40), 10), Tenant("light2", n(40), 10)),
        ),
        Scenario(
            "sybil",
            (
                Tenant("sybil", n(800), 10, keys=100),
                Tenant("light1", n(80), 10),
                Tenant("light2", n(80), 10),
            ),
        ),
        Scenario(
            "sybil-weighted",
            (
                Tenant("sybil", n(800), 10, keys=100, weight=1),
                Tenant("light1", n(80), 10),
                Tenant("light2", n(80), 10),
            ),
            # the sybil's prefix weighs 1/100 a key: its 100 keys weigh one tenant
            weights={"sybil:*": 0.01},
        ),
        Scenario(
            "sybil-tenant",
            (
                Tenant("sybil", n(800), 10),
                Tenant("light1", n(80), 10),
                Tenant("light2", n(80), 10),
            ),
        ),
        Scenario(
            "tiers",
            (
                Tenant("gold:a", n(400), 10, weight=4),
                Tenant("silver:a", n(400), 10, weight=2),
                Tenant("bronze:a", n(400), 10, weight=1),
            ),
            weights={"gold:*": 4, "silver:*": 2},
        ),
        Scenario(
            "burst",
            (
                Tenant("flood", n(800), 10),
                Tenant("bursty", n(120), 10, burst=max(2, n(20)), every_s=0.5),
            ),
        ),
        Scenario("slow", (Tenant("slow", n(200), 50), Tenant("fast", n(1000), 5))),
    ]


@dataclass
class Run:
    scenario: str
    way: str
    tenants: dict[str, dict[str, float]]
    worst_share: float
    jain: float
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "way": self.way,
            "tenants": self.tenants,
            "worst_share": self.worst_share,
            "jain": self.jain,
            "seconds": self.seconds,
        }


def _submission(queue: str, way: str, tenant: Tenant, n: int) -> JobSubmission:
    fields: dict[str, Any] = {
        "queue": queue,
        "type": "bench.sleep",
        "payload": {"ms": tenant.ms, "tenant": tenant.name},
    }
    if way in ("fair", "fair-limited"):
        fields["fairness_key"] = tenant.key(n)
    if way == "fair-limited":
        fields["limit_keys"] = [UPSTREAM]
    elif way == "round-robin":
        fields["limit_keys"] = [tenant.key(n)]
    return JobSubmission.model_validate(fields)


async def _produce(store: JobStore, queue: str, way: str, tenant: Tenant) -> None:
    if not tenant.burst:
        subs = [_submission(queue, way, tenant, n) for n in range(tenant.jobs)]
        for first in range(0, len(subs), 1000):
            await store.submit_batch(subs[first : first + 1000])
        return
    sent = 0
    while sent < tenant.jobs:
        size = min(tenant.burst, tenant.jobs - sent)
        await store.submit_batch([_submission(queue, way, tenant, sent + i) for i in range(size)])
        sent += size
        await asyncio.sleep(tenant.every_s)


def jain(shares: Iterable[float]) -> float:
    xs = list(shares)
    total = sum(xs)
    squares = sum(x * x for x in xs)
    return total * total / (len(xs) * squares) if squares else 1.0


def _percentile(samples: list[float], p: int) -> float:
    if len(samples) == 1:
        return samples[0]
    return statistics.quantiles(samples, n=100, method="inclusive")[p - 1]


async def run_scenario(
    pool: asyncpg.Pool, store: JobStore, scenario: Scenario, way: str, workers: int
) -> Run:
    queue = f"fair-{scenario.name}-{way}"
    await pool.execute("DELETE FROM evora.fairness_weights")
    await pool.execute("DELETE FROM evora.flow_limits")
    if way in ("fair", "fair-limited"):
        weights = FairnessStore(pool)
        for key, weight in scenario.weights.items():
            await weights.put(key, weight)
    if way == "fair-limited":
        await pool.execute(
            "INSERT INTO evora.flow_limits (key, concurrency) VALUES ($1, $2)",
            UPSTREAM,
            max(1, workers // 2),
        )
    elif way == "round-robin":
        # a limit that never binds: the claim is the limited one, round-robin over lanes
        await pool.execute(
            "INSERT INTO evora.flow_limits (key, concurrency) VALUES ($1, 1000000)",
            f"queue:{queue}",
        )
    total = sum(t.jobs for t in scenario.tenants)
    done = 0
    # submitted in full before the claimers start, except bursts (they arrive meanwhile)
    await asyncio.gather(*(_produce(store, queue, way, t) for t in scenario.tenants if not t.burst))
    started = time.perf_counter()

    async def worker(n: int) -> None:
        nonlocal done
        while done < total:
            claimed = await store.claim(worker_id=f"w{n}", queues=[queue], max_jobs=1)
            if not claimed:
                await asyncio.sleep(0.005)
                continue
            for job in claimed:
                await asyncio.sleep(job["payload"]["ms"] / 1000)
            await store.complete_many(
                [Completion(j["id"], j["lease_token"]) for j in claimed], with_jobs=False
            )
            done += len(claimed)

    await asyncio.gather(
        *(worker(n) for n in range(workers)),
        *(_produce(store, queue, way, t) for t in scenario.tenants if t.burst),
    )
    seconds = time.perf_counter() - started
    rows = await pool.fetch(
        "SELECT payload ->> 'tenant' AS tenant, created_at, started_at, finished_at "
        "FROM evora.jobs WHERE queue = $1",
        queue,
    )
    return _judge(scenario, way, rows, seconds)


Interval = tuple[float, float]


def _union(spans: list[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for begin, end in sorted(spans):
        if merged and begin <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        elif end > begin:
            merged.append((begin, end))
    return merged


def _intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        begin, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if begin < end:
            out.append((begin, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _overlap(span: Interval, spans: list[Interval]) -> float:
    return sum(max(0.0, min(span[1], e) - max(span[0], b)) for b, e in spans)


def _judge(scenario: Scenario, way: str, rows: list[asyncpg.Record], seconds: float) -> Run:
    def at(moment: Any) -> float:
        return float(moment.timestamp())

    by_tenant: dict[str, list[asyncpg.Record]] = {t.name: [] for t in scenario.tenants}
    for r in rows:
        by_tenant[r["tenant"]].append(r)
    # Contention: the moments at which every tenant had a job waiting (submitted, not yet
    # claimed). Each tenant's share is the worker time its jobs held in those moments.
    contention = _union([(at(r["created_at"]), at(r["started_at"])) for r in rows])
    for jobs in by_tenant.values():
        contention = _intersect(
            contention, _union([(at(r["created_at"]), at(r["started_at"])) for r in jobs])
        )
    received = {
        name: sum(_overlap((at(r["started_at"]), at(r["finished_at"])), contention) for r in jobs)
        for name, jobs in by_tenant.items()
    }
    used = sum(received.values())
    weights = {t.name: t.weight for t in scenario.tenants}
    whole = sum(weights.values())
    shares = {
        name: (received[name] / used) / (weights[name] / whole) if used > 0 else 1.0
        for name in by_tenant
    }
    tenants = {}
    for name, jobs in by_tenant.items():
        waits = [(r["started_at"] - r["created_at"]).total_seconds() * 1000 for r in jobs]
        tenants[name] = {
            "wait_p50_ms": _percentile(waits, 50),
            "wait_p99_ms": _percentile(waits, 99),
            "share": shares[name],
        }
    return Run(scenario.name, way, tenants, min(shares.values()), jain(shares.values()), seconds)


def table(runs: list[Run]) -> list[str]:
    lines = [
        "| scenario | way | worst share | Jain | per tenant: wait p50 / p99 ms, share |",
        "| --- | --- | --- | --- | --- |",
    ]
    for scenario in dict.fromkeys(r.scenario for r in runs):
        for run in (r for r in runs if r.scenario == scenario):
            cells = "; ".join(
                f"{name} {t['wait_p50_ms']:,.0f} / {t['wait_p99_ms']:,.0f}, {t['share']:.2f}"
                for name, t in run.tenants.items()
            )
            lines.append(
                f"| {run.scenario} | {run.way} | {run.worst_share:.3f} | {run.jain:.3f} | {cells} |"
            )
        lines.append(f"| {scenario} | ideal | 1.000 | 1.000 | every share 1.00 |")
    return lines


async def measure(
    directory: Path, chosen: list[Scenario], ways: list[str], workers: int
) -> list[Run]:
    with LocalPostgres(directory / "pg", durable=True) as server:
        dsn = server.dsn()
        await apply_migrations(dsn)
        pool = await create_pool(dsn, min_size=workers + 2, max_size=workers + 4)
        store = JobStore(pool)
        try:
            runs = []
            for scenario in chosen:
                for way in ways:
                    runs.append(await run_scenario(pool, store, scenario, way, workers))
            return runs
        finally:
            await store.close()
            await pool.close()


async def _drain(
    store: JobStore, queue: str, jobs: int, claimers: int, max_jobs: int
) -> list[float]:
    """Claim and complete `jobs` jobs of `queue`; the latency of every claim."""
    latencies: list[float] = []
    done = 0

    async def claimer(n: int) -> None:
        nonlocal done
        while done < jobs:
            began = time.perf_counter()
            claimed = await store.claim(worker_id=f"c{n}", queues=[queue], max_jobs=max_jobs)
            latencies.append(time.perf_counter() - began)
            if not claimed:
                await asyncio.sleep(0.002)
                continue
            await store.complete_many(
                [Completion(j["id"], j["lease_token"]) for j in claimed], with_jobs=False
            )
            done += len(claimed)

    await asyncio.gather(*(claimer(n) for n in range(claimers)))
    return latencies


# The cost of the fair claim with many active keys, against the unkeyed claim: `jobs` jobs
# over `keys` keys (or none), drained by `claimers` claimers of `max_jobs` each.
async def cost(directory: Path, keys: int, jobs: int, claimers: int, max_jobs: int) -> list[str]:
    lines = []
    with LocalPostgres(directory / "pg", durable=True) as server:
        dsn = server.dsn()
        await apply_migrations(dsn)
        pool = await create_pool(dsn, min_size=claimers + 2, max_size=claimers + 2)
        store = JobStore(pool)
        try:
            for keyed in (False, True):
                queue = "cost-keyed" if keyed else "cost-unkeyed"
                subs = [
                    JobSubmission.model_validate(
                        {"queue": queue, "type": "bench.noop"}
                        | ({"fairness_key": f"tenant:{n % keys}"} if keyed else {})
                    )
                    for n in range(jobs)
                ]
                for first in range(0, jobs, 1000):
                    await store.submit_batch(subs[first : first + 1000])
                await pool.execute("VACUUM ANALYZE")
                started = time.perf_counter()
                latencies = await _drain(store, queue, jobs, claimers, max_jobs)
                drain = time.perf_counter() - started
                cuts = statistics.quantiles(latencies, n=100)
                lines.append(
                    f"{'fair, ' + format(keys, ',') + ' keys' if keyed else 'unkeyed'}: "
                    f"{jobs} jobs, {claimers} claimers x {max_jobs}: drain {jobs / drain:,.0f} "
                    f"jobs/s, claim p50 {cuts[49] * 1000:.2f} ms p99 {cuts[98] * 1000:.2f} ms"
                )
        finally:
            await store.close()
            await pool.close()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the CI smoke's size (1/10)")
    parser.add_argument("--scenario", action="append", help="run only these (repeatable)")
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--json", type=Path, help="also write the runs here")
    parser.add_argument("--cost", action="store_true", help="the 10,000-key cost instead")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--claimers", type=int, default=8)
    parser.add_argument("--max-jobs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="evora-bench-fairness-") as directory:
        if args.cost:
            for line in asyncio.run(
                cost(Path(directory), args.keys, args.jobs, args.claimers, args.max_jobs)
            ):
                print(line)
            return
        chosen = [
            s
            for s in scenarios(0.1 if args.quick else 1.0)
            if not args.scenario or s.name in args.scenario
        ]
        runs = asyncio.run(measure(Path(directory), chosen, args.ways.split(","), args.workers))
    for line in table(runs):
        print(line)
    if args.json:
        args.json.write_text(json.dumps([r.as_dict() for r in runs], indent=2) + "\n")


if __name__ == "__main__":
    main()
