"""A replicated deployment under load: two api, three dispatcher, two sweeper and two
projector processes (real `evora` children) on one PostgreSQL, the HTTP services behind
Debian's HAProxy, producers submitting with idempotency keys and SDK workers claiming through
the balancer. While the load runs, one replica of each service is SIGKILLed and restarted in
turn (for the sweeper and the projector the active one, so that leadership has to move) and
one dispatcher is drained with SIGTERM while it holds long-polls.

What the clients saw is what the balancer logged: every 5xx is a gateway status the SDK
repeats, no producer call failed, no worker died. What the system did is read from
PostgreSQL afterwards: every accepted key is exactly one job and all completed; from the
job_events history, the concurrency limit and the FIFO groups held across dispatchers."""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import signal
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import aiohttp
import asyncpg
import pytest

import evora.sql_enqueue
from evora import Client, Handlers, Job, SubmitOptions, Worker
from evora.protocol.retries import RETRYABLE_STATUSES
from evora.storage.leadership import STANDBY_SECONDS
from tests.e2e.conftest import (
    FAST,
    WORKER_HEADERS,
    Child,
    Children,
    LogRecords,
    free_port,
    scrape,
    spawn_service,
)
from tests.polling import until
from tests.servers import ADMIN_TOKEN, PRODUCER_TOKEN, WORKER_TOKEN

PLAIN, LIMITED, FIFO = "rep-plain", "rep-limited", "rep-fifo"
CONCURRENCY = 2  # the limit on queue:rep-limited
GROUPS = 4
# docs/deploy.md: a standby retries the lock every 0.5-1.5 x STANDBY_SECONDS, so it leads
# within 1.5 x STANDBY_SECONDS of the leader's session ending (a SIGKILLed leader's session
# ends at once); one more second for the scrape on a loaded machine.
LEADERSHIP_BOUND = 1.5 * STANDBY_SECONDS + 1.0
LEASE_SECONDS = 5  # a claim answered into a dropped connection waits this out
REPLICAS = {"api": 2, "dispatcher": 3, "sweeper": 2, "projector": 2}
# Each producer's pause between submissions, and how long a job of the limited queue runs.
# The load lasts as long as the kills, takeovers and restarts take (each restart a process
# start on a loaded machine), and all it submits passes through every service: pausing
# 0.03 s, the producers made 1,257-1,530 jobs in five runs on a loaded 2-core machine (load
# 6-10), four to five times the 300 checked below, and with the workers kept the restarting
# replicas from the CPU. The limit must be reached all along, not only held: the limited
# queue gets every other submission of one producer, one per 2 x (pause + round trip), and
# its jobs run long enough for those to overlap even where a round trip takes 80 ms (0.28 s
# apart, 0.4 s each); where it is quick the arrivals (up to 7.7/s) outpace the limit's
# 5/s and a backlog waits, as before (14/s against 8/s).
PRODUCER_PAUSE = 0.06
LIMITED_SECONDS = 0.4

# Retries at the balancer: a connection that could not be opened never reached a server, so
# any request may go to another one (`conn-failure`); a request sent to a server that then
# closed without answering (`empty-response`) may have been acted on, so it is repeated only
# when it is idempotent by method. Claims, submissions and outcomes are POSTs: the SDK
# decides about those (submissions with idempotency keys, outcomes with their lease token);
# a claim repeated by the balancer could hand jobs to a response nobody reads.
# `abortonclose` passes a client's closed connection on to the server: without it a worker
# that abandons its long-poll leaves the dispatcher waiting for it, and the next job is
# claimed into an answer HAProxy throws away (RUNNING until its lease expires).
HAPROXY_CONFIG = """
global
    log stdout format raw local0
    maxconn 4096

defaults
    mode http
    log global
    log-format "LB %b %s %ST %HM %HU"
    option redispatch 1
    option abortonclose
    retries 3
    timeout connect 1s
    timeout client 75s
    timeout server 75s
    timeout check 1s
    default-server check inter 300ms fall 1 rise 1

{sections}
"""

SERVICE_SECTIONS = """
frontend {name}
    bind 127.0.0.1:{port}
    use_backend {name}_idempotent if METH_GET || METH_HEAD || {{ method PUT DELETE }}
    default_backend {name}

backend {name}_idempotent
    option httpchk GET /readyz
    retry-on conn-failure empty-response
{servers}

backend {name}
    option httpchk GET /readyz
    retry-on conn-failure
{servers}
"""


def haproxy() -> str:
    found = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(found).exists():
        pytest.fail("haproxy is missing: scripts/test.sh installs Debian's haproxy package")
    return found


@dataclass(frozen=True)
class Answered:
    backend: str
    server: str
    status: int
    method: str
    path: str


@dataclass
class Replica:
    service: str
    port: int
    child: Child

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Deployment:
    children: Children
    http: aiohttp.ClientSession
    db_url: str
    variables: dict[str, str]
    replicas: dict[str, list[Replica]] = field(default_factory=dict)
    balancer: Child | None = None
    fronts: dict[str, str] = field(default_factory=dict)

    async def start(self, service: str, port: int) -> Replica:
        child = await spawn_service(
            self.children, self.http, self.db_url, service, port, **self.variables
        )
        return Replica(service, port, child)

    async def start_all(self, replicas: dict[str, int]) -> None:
        for service, count in replicas.items():
            ports = [free_port() for _ in range(count)]
            self.replicas[service] = list(
                await asyncio.gather(*(self.start(service, port) for port in ports))
            )

    async def start_balancer(self, directory: Path) -> None:
        sections = []
        for service in ("api", "dispatcher"):
            if service not in self.replicas:
                continue
            port = free_port()
            servers = "\n".join(
                f"    server {service}{i} 127.0.0.1:{r.port}"
                for i, r in enumerate(self.replicas[service])
            )
            sections.append(SERVICE_SECTIONS.format(name=service, port=port, servers=servers))
            self.fronts[service] = f"http://127.0.0.1:{port}"
        config = directory / "haproxy.cfg"
        config.write_text(HAPROXY_CONFIG.format(sections="".join(sections)))
        self.balancer = await self.children.spawn(
            "haproxy", [haproxy(), "-db", "-f", str(config)], {}
        )
        for front in self.fronts.values():
            await self.balancer.until_ready(self.http, front)

    async def restart(self, replica: Replica) -> Replica:
        fresh = await self.start(replica.service, replica.port)
        group = self.replicas[replica.service]
        group[group.index(replica)] = fresh
        return fresh

    async def active(self, service: str) -> list[Replica]:
        """The replicas whose `evora_<service>_active` gauge reads 1."""
        leading = []
        for replica in self.replicas[service]:
            if not replica.child.running:
                continue
            with contextlib.suppress(aiohttp.ClientError):
                if (await scrape(self.http, replica.url)).get((f"evora_{service}_active",)) == 1:
                    leading.append(replica)
        return leading

    def balancer_log(self) -> list[Answered]:
        """Every request the balancer answered."""
        assert self.balancer is not None
        lines = []
        for line in self.balancer.output().splitlines():
            if line.startswith("LB "):
                _, backend, server, status, method, uri = line.split(" ", 5)
                lines.append(Answered(backend, server, int(status), method, uri.split("?")[0]))
        return lines


@dataclass
class Load:
    """Producers through the balancer: key -> job id of every accepted submission, and the
    FIFO jobs of each group in the order their submissions were accepted."""

    accepted: dict[str, str] = field(default_factory=dict)
    fifo_order: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    failures: list[BaseException] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def produce(self, client: Client, name: str) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            key = f"{name}-{n}"
            # One producer alone submits to the FIFO queue, so the order its submissions
            # were accepted in is the order the groups must run in.
            queue = FIFO if name == "fifo" else (PLAIN, LIMITED)[n % 2]
            options: SubmitOptions = {"idempotency_key": key, "lease_seconds": LEASE_SECONDS}
            group = f"g{n % GROUPS}"
            if queue == FIFO:
                options["group_key"] = group
            try:
                result = await client.submit(queue, "work", {"key": key}, **options)
            except Exception as exc:  # counted: a producer must see none
                self.failures.append(exc)
                continue
            self.accepted[key] = str(result.job["id"])
            if queue == FIFO:
                self.fifo_order[group].append(str(result.job["id"]))
            await asyncio.sleep(PRODUCER_PAUSE)


async def test_kills_restarts_and_a_drain_lose_nothing_and_break_no_promise(
    db_url: str,
    pool: asyncpg.Pool,
    mongo_url: str,
    mongo_db_name: str,
    children: Children,
    tmp_path: Path,
    worker_log: LogRecords,
) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        deployment = Deployment(
            children,
            http,
            db_url,
            {"EVORA_MONGO_URL": mongo_url, "EVORA_MONGO_DB": mongo_db_name},
        )
        await deployment.start_all(REPLICAS)
        await deployment.start_balancer(tmp_path)
        api, dispatchers = deployment.fronts["api"], deployment.fronts["dispatcher"]

        handlers = Handlers()

        @handlers.job("work")
        async def work(job: Job) -> None:
            # Limited jobs run long enough for their arrivals to overlap, so the limit is
            # reached (and has to hold) all along.
            await asyncio.sleep(
                LIMITED_SECONDS if job.queue == LIMITED else random.uniform(0.01, 0.08)
            )

        load = Load()
        async with (
            Client(api, PRODUCER_TOKEN, timeout=10, retry_backoff=FAST) as producer,
            Client(api, PRODUCER_TOKEN, timeout=10, retry_backoff=FAST) as fifo_producer,
            Client(api, ADMIN_TOKEN, timeout=10, retry_backoff=FAST) as admin,
        ):
            await admin.set_limit(f"queue:{LIMITED}", concurrency=CONCURRENCY)
            workers = [
                Worker(
                    dispatchers,
                    WORKER_TOKEN,
                    [PLAIN, LIMITED, FIFO],
                    handlers=handlers,
                    concurrency=4,
                    wait_seconds=5.0,
                    grace_period=10.0,
                    backoff=FAST,
                    request_timeout=5.0,
                )
                for _ in range(3)
            ]
            serving = [asyncio.create_task(w.serve()) for w in workers]
            producing = [
                asyncio.create_task(load.produce(producer, "plain")),
                asyncio.create_task(load.produce(fifo_producer, "fifo")),
            ]

            async def steady(seconds: float) -> None:
                """Let the load run; a worker that died fails the test here."""
                before = len(load.accepted)
                await asyncio.sleep(seconds)
                for task in serving:
                    if task.done():
                        raise AssertionError("a worker died") from task.exception()
                assert len(load.accepted) > before, "the producers made no progress"

            takeovers: dict[str, float] = {}
            try:
                await steady(3)
                # SIGKILL and restart one replica of each service in turn.
                for service in REPLICAS:
                    if service in ("sweeper", "projector"):
                        await until(
                            partial(_one_active, deployment, service),
                            within=15,
                            what=f"one {service} leads",
                        )
                        (victim,) = await deployment.active(service)
                    else:
                        victim = deployment.replicas[service][0]
                    victim.child.send(signal.SIGKILL)
                    await victim.child.wait(10)
                    if service in ("sweeper", "projector"):
                        # The standby takes over within the documented bound.
                        takeovers[service] = await until(
                            partial(_one_active, deployment, service),
                            within=LEADERSHIP_BOUND,
                            what=f"a standby {service} leads after the leader was killed",
                        )
                    await steady(1.5)
                    await deployment.restart(victim)
                    await steady(1.5)

                # Drain one dispatcher gracefully while it holds long-polls.
                drained = deployment.replicas["dispatcher"][1]
                await until(
                    lambda: _holds_long_polls(http, drained),
                    within=20,
                    what="the dispatcher to drain holds long-polls",
                )
                drained.child.send(signal.SIGTERM)
                assert await drained.child.wait(40) == 0, drained.child.output()
                await steady(1.5)
                await deployment.restart(drained)
                await steady(2)
            finally:
                load.stop.set()
                await asyncio.gather(*producing)

            # Everything accepted completes.
            async def all_completed() -> bool:
                done = await pool.fetchval(
                    "SELECT count(*) FROM evora.jobs WHERE queue = ANY($1) AND state = 'COMPLETED'",
                    [PLAIN, LIMITED, FIFO],
                )
                return int(done) == len(load.accepted)

            await until(all_completed, within=60, what="every accepted job completed")
            for worker in workers:
                await asyncio.wait_for(worker.stop(), 30)
            await asyncio.gather(*serving)

        # What the clients saw: no failed producer call; every 5xx the balancer answered
        # is a gateway status the SDK repeats; the workers' failed calls (a connection a
        # killed or draining dispatcher dropped) were all retried, they only logged them.
        assert not load.failures, load.failures
        answered = deployment.balancer_log()
        errors = Counter(a for a in answered if a.status >= 500)
        retried = Counter(m.split(" (")[0] for m in worker_log.messages if "retrying" in m)
        print(
            f"{len(load.accepted)} jobs; {len(answered)} requests through the balancer;"
            f" 5xx answered: {dict(errors)}; worker calls retried: {dict(retried)};"
            f" leadership moved in {takeovers} s"
        )
        assert all(a.status in RETRYABLE_STATUSES for a in errors), errors
        # The balancer spread the producers over both api replicas and the workers' claims
        # over all three dispatchers.
        served = {(a.server, a.path) for a in answered if a.status < 300}
        assert {f"api{i}" for i in range(2)} <= {s for s, p in served if p == "/v1/jobs"}
        claims = {s for s, p in served if p == "/v1/claim"}
        assert {f"dispatcher{i}" for i in range(3)} <= claims

        # No lost and no duplicate job: every accepted key is exactly one job.
        rows = await pool.fetch(
            "SELECT idempotency_key, id::text AS id, state::text AS state FROM evora.jobs"
            " WHERE queue = ANY($1)",
            [PLAIN, LIMITED, FIFO],
        )
        assert {r["idempotency_key"]: r["id"] for r in rows} == load.accepted
        assert len(rows) == len(load.accepted) > 300
        assert {r["state"] for r in rows} == {"COMPLETED"}

        # The limit and the FIFO groups held across the dispatchers, from the history.
        events = await pool.fetch(
            "SELECT e.job_id::text AS job_id, e.queue, e.event, e.from_state::text AS from_state,"
            " e.to_state::text AS to_state, j.group_key"
            " FROM evora.job_events e JOIN evora.jobs j ON j.id = e.job_id"
            " WHERE e.queue = ANY($1) ORDER BY e.seq",
            [LIMITED, FIFO],
        )
        running: Counter[str] = Counter()
        most: Counter[str] = Counter()
        first_claims: dict[str, list[str]] = defaultdict(list)
        for e in events:
            holder = LIMITED if e["queue"] == LIMITED else f"group {e['group_key']}"
            if e["to_state"] == "RUNNING" and e["from_state"] != "RUNNING":
                running[holder] += 1
                most[holder] = max(most[holder], running[holder])
                if e["queue"] == FIFO and e["job_id"] not in first_claims[holder]:
                    first_claims[holder].append(e["job_id"])
            elif e["from_state"] == "RUNNING" and e["to_state"] != "RUNNING":
                running[holder] -= 1
        assert most[LIMITED] == CONCURRENCY, most  # reached, never exceeded
        assert all(most[f"group g{g}"] == 1 for g in range(GROUPS)), most
        for group, order in load.fifo_order.items():
            assert first_claims[f"group {group}"] == order, f"{group} claimed out of order"


async def _one_active(deployment: Deployment, service: str) -> bool:
    return len(await deployment.active(service)) == 1


async def _holds_long_polls(http: aiohttp.ClientSession, replica: Replica) -> bool:
    samples = await scrape(http, replica.url)
    return sum(v for k, v in samples.items() if k[0] == "evora_dispatcher_waiting_polls") > 0


async def test_a_long_poll_abandoned_at_the_balancer_strands_no_job(
    pool: asyncpg.Pool, db_url: str, children: Children, tmp_path: Path
) -> None:
    """A worker that gives up its long-poll (killed, or its request timed out) closes its
    connection to the balancer. Unless the balancer passes that on (`option abortonclose`),
    the dispatcher keeps waiting for it, claims the next job into an answer the balancer
    throws away, and the job sits RUNNING until its lease expires."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        deployment = Deployment(children, http, db_url, {})
        await deployment.start_all({"dispatcher": 1})
        await deployment.start_balancer(tmp_path)
        (dispatcher,) = deployment.replicas["dispatcher"]
        claim = {"worker_id": "gone", "queues": [PLAIN], "max_jobs": 1, "wait_seconds": 30}
        async with aiohttp.ClientSession() as worker:
            polling = asyncio.create_task(
                worker.post(
                    deployment.fronts["dispatcher"] + "/v1/claim",
                    json=claim,
                    headers=WORKER_HEADERS,
                )
            )
            await until(
                lambda: _holds_long_polls(http, dispatcher),
                what="the dispatcher holds the worker's long-poll",
            )
            polling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await polling
        # The worker's connection is closed: the dispatcher must stop waiting for it.
        await until(
            lambda: _holds_no_long_polls(http, dispatcher),
            what="the dispatcher dropped the long-poll its worker abandoned",
        )
        async with pool.acquire() as conn:
            job_id = await evora.sql_enqueue.submit(conn, PLAIN, "work")
        async with http.post(
            deployment.fronts["dispatcher"] + "/v1/claim",
            json={**claim, "worker_id": "next", "wait_seconds": 0},
            headers=WORKER_HEADERS,
        ) as answer:
            assert answer.status == 200
            (job,) = (await answer.json())["jobs"]
        assert (job["id"], job["attempt"]) == (str(job_id), 1)


async def _holds_no_long_polls(http: aiohttp.ClientSession, replica: Replica) -> bool:
    return not await _holds_long_polls(http, replica)
