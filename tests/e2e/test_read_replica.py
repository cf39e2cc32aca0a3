"""Reads from a read replica (docs/scaling.md#read-replica): a primary PostgreSQL and a hot
standby of it (`pg_basebackup -R`, streaming replication) whose replay is held back by
`recovery_min_apply_delay`, so that the standby is really behind; two real `evora api`
processes with EVORA_READ_DATABASE_URL on the standby and a real `evora dispatcher`.

What a client was answered is what is asserted: a client that submits and at once reads
(through either api process: nothing sticks to one) finds its job, many at the same time;
a client's successive reads of a job never go backwards while another one moves it (its
reads answered now by the standby, now by the primary); with
the standby stopped, every read still answers 200 from the primary and the fallbacks are
counted. The lag measured and the share of reads the replica served are printed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from evora import Client
from evora.embedded import LocalPostgres
from evora.embedded._pgbin import find_bin_dir
from evora.embedded._runas import server_account
from evora.protocol.positions import READ_AFTER_HEADER, parse_position
from evora.storage.replica import REPLICA_POSITION
from tests.databases import create_database
from tests.e2e.clusters import cluster_dir, migrated_primary
from tests.e2e.conftest import WORKER_HEADERS, Children, free_port, scrape, spawn_service
from tests.polling import until
from tests.servers import ADMIN_TOKEN, PRODUCER_TOKEN

# How long the standby holds back each commit it received: the lag every read meets.
APPLY_DELAY_MS = 500
# EVORA_READ_REPLICA_MAX_WAIT_MS of the two api processes. The first one's, the default, is
# shorter than the delay: a read of what its client just wrote goes to the primary (a
# `behind` fallback). The second one's is longer: such a read waits for the standby to
# replay the write and is served by it. A client alternates between the two.
MAX_WAITS_MS = (200, 1500)
QUEUE = "replica"
PRODUCER = {"Authorization": f"Bearer {PRODUCER_TOKEN}"}
FALLBACKS = "evora_read_replica_fallbacks_total"
SERVED = "evora_read_replica_reads_total"
LAG = "evora_read_replica_lag_seconds"


@dataclass
class Replicated:
    primary: LocalPostgres
    standby: LocalPostgres
    database: str  # the test's own, on both
    apis: list[str]
    dispatcher: str


def _standby_of(
    primary: LocalPostgres, data_dir: Path, apply_delay_ms: int | None = APPLY_DELAY_MS
) -> LocalPostgres:
    """A hot standby of `primary` in `data_dir`, streaming from it, replaying each commit
    `apply_delay_ms` after the primary made it (None: as soon as it arrives)."""
    subprocess.run(
        [
            str(find_bin_dir() / "pg_basebackup"),
            *("-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres"),
            *("-D", str(data_dir), "-R", "-X", "stream", "--checkpoint=fast", "--no-sync"),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    if apply_delay_ms is not None:
        with (data_dir / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"recovery_min_apply_delay = '{apply_delay_ms}ms'\n")
    if (account := server_account()) is not None:  # the copy was made as root
        for root, dirs, files in os.walk(data_dir):
            for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                os.chown(name, account.uid, account.gid)
    data_dir.chmod(0o700)
    return LocalPostgres(data_dir, durable=False)


@pytest.fixture(scope="module")
async def servers() -> AsyncIterator[tuple[LocalPostgres, LocalPostgres]]:
    """One primary and standby for the module, with the services on a database of their own
    (`replicated`); the one test that stops the standby starts it again."""
    with cluster_dir("evora-test-replica-") as tmp:
        async with _primary_and_standby(tmp) as pair:
            yield pair


@contextlib.asynccontextmanager
async def _primary_and_standby(tmp: Path) -> AsyncIterator[tuple[LocalPostgres, LocalPostgres]]:
    """A migrated primary (Evora's schema in its `postgres` database) and its hot standby.
    initdb's pg_hba.conf trusts replication connections from 127.0.0.1, and wal_level=replica
    with max_wal_senders=10 are PostgreSQL's defaults."""
    primary = await migrated_primary(tmp / "primary")
    await asyncio.to_thread(primary.start)
    standby: LocalPostgres | None = None
    try:
        standby = await asyncio.to_thread(_standby_of, primary, tmp / "standby")
        await asyncio.to_thread(standby.start)
        # A transaction replayed, so that the standby can tell its lag (replica.sql).
        await _commit_and_replay(primary, standby)
        yield primary, standby
    finally:
        if standby is not None:
            await asyncio.to_thread(standby.stop)
        await asyncio.to_thread(primary.stop)


async def _commit_and_replay(
    primary: LocalPostgres, standby: LocalPostgres, database: str = "postgres"
) -> None:
    conn = await asyncpg.connect(primary.dsn(database))
    try:
        await conn.fetchval("SELECT txid_current()")  # commits a transaction with an id
    finally:
        await conn.close()

    async def replayed() -> bool:
        try:
            conn = await asyncpg.connect(standby.dsn(database))
        except asyncpg.InvalidCatalogNameError:
            return False  # the database itself is not replayed yet
        try:
            return (await conn.fetchrow(REPLICA_POSITION))["replay_age"] is not None
        finally:
            await conn.close()

    await until(replayed, f"the standby replays a transaction in {database}", within=30)


@pytest.fixture(scope="module")
async def replicated(
    servers: tuple[LocalPostgres, LocalPostgres], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Replicated]:
    """The services, started once for the module (each `evora` process costs more than a
    second of CPU to start), on a database of their own, a copy of the migrated `postgres`
    one, replayed on the standby (left in place: the cluster goes with the module). Each test
    keeps to a queue of its own and counts the metrics from where they stood when it began."""
    children = Children(tmp_path_factory.mktemp("replica-services"))
    try:
        async with aiohttp.ClientSession() as http:
            yield await _services(servers, children, http)
    finally:
        await children.close()


async def _services(
    servers: tuple[LocalPostgres, LocalPostgres], children: Children, http: aiohttp.ClientSession
) -> Replicated:
    primary, standby = servers
    database = f"replica_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(primary.dsn("template1"))
    try:
        await create_database(admin, database, "postgres")
    finally:
        await admin.close()
    await _commit_and_replay(primary, standby, database)
    apis = []
    for max_wait in MAX_WAITS_MS:
        port = free_port()
        await spawn_service(
            children,
            http,
            primary.dsn(database),
            "api",
            port,
            EVORA_READ_DATABASE_URL=standby.dsn(database),
            EVORA_READ_REPLICA_MAX_WAIT_MS=str(max_wait),
        )
        apis.append(f"http://127.0.0.1:{port}")
    port = free_port()
    await spawn_service(children, http, primary.dsn(database), "dispatcher", port)
    return Replicated(primary, standby, database, apis, f"http://127.0.0.1:{port}")


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@dataclass
class RawClient:
    """A client over raw HTTP that keeps the highest Evora-Read-After it was answered
    and sends it back, each request to an api process chosen at random (seeded: a run can
    be repeated)."""

    http: aiohttp.ClientSession
    apis: list[str]
    position: int = 0
    seed: int = 0
    queue: str = QUEUE

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)

    def _next_api(self) -> str:
        return self._random.choice(self.apis)

    def _headers(self) -> dict[str, str]:
        headers = dict(PRODUCER)
        if self.position:
            headers[READ_AFTER_HEADER] = f"{self.position >> 32:X}/{self.position & 0xFFFFFFFF:X}"
        return headers

    def _remember(self, response: aiohttp.ClientResponse) -> None:
        answered = parse_position(response.headers.get(READ_AFTER_HEADER, ""))
        assert answered is not None, f"no {READ_AFTER_HEADER} on {response.method} {response.url}"
        assert answered >= self.position, "a position went backwards"
        self.position = answered

    async def submit(self, **fields: Any) -> str:
        body = {"queue": self.queue, "type": "t", "payload": {}, **fields}
        async with self.http.post(
            self._next_api() + "/v1/jobs", json=body, headers=self._headers()
        ) as response:
            assert response.status == 201, await response.text()
            self._remember(response)
            job_id: str = (await response.json())["id"]
            return job_id

    async def get(self, job_id: str) -> dict[str, Any]:
        job = await self.find(job_id)
        assert job is not None, f"job {job_id} not found"
        return job

    async def find(self, job_id: str) -> dict[str, Any] | None:
        """The job, or None when the answer was 404."""
        async with self.http.get(
            f"{self._next_api()}/v1/jobs/{job_id}", headers=self._headers()
        ) as response:
            if response.status == 404:
                return None
            assert response.status == 200, f"{response.status}: {await response.text()}"
            self._remember(response)
            job: dict[str, Any] = await response.json()
            return job


Counted = tuple[float, dict[str, float]]


async def _counted(http: aiohttp.ClientSession, apis: list[str]) -> Counted:
    """(reads the replica served, fallbacks by reason) over the api processes."""
    served, fallbacks = 0.0, dict[str, float]()
    for api in apis:
        for key, value in (await scrape(http, api)).items():
            if key[0] == SERVED:
                served += value
            elif key[0] == FALLBACKS:
                reason = key[1].removeprefix("reason=")
                fallbacks[reason] = fallbacks.get(reason, 0) + value
    return served, fallbacks


async def _lags(http: aiohttp.ClientSession, apis: list[str]) -> list[float]:
    """The standby's lag as each api process last measured it."""
    return [(await scrape(http, api))[(LAG,)] for api in apis]


@contextlib.asynccontextmanager
async def _lag_sampled(
    http: aiohttp.ClientSession, apis: list[str], what: str
) -> AsyncIterator[None]:
    """Samples the lag the api processes measure every 50 ms while the block runs; prints
    what it saw."""
    samples: list[float] = []

    async def sample() -> None:
        while True:
            samples.extend(await _lags(http, apis))
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    try:
        yield
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        if samples:
            ordered = sorted(samples)
            print(
                f"{what}: standby lag over {len(samples)} samples: median "
                f"{ordered[len(ordered) // 2]:.3f}s, max {ordered[-1]:.3f}s "
                f"(recovery_min_apply_delay {APPLY_DELAY_MS} ms)"
            )


def _since(now: Counted, before: Counted) -> Counted:
    """What was counted between `before` and `now` (the api processes serve the module)."""
    return now[0] - before[0], {
        reason: n - before[1].get(reason, 0) for reason, n in now[1].items()
    }


def _report(what: str, served: float, fallbacks: dict[str, float]) -> None:
    total = served + sum(fallbacks.values())
    share = served / total if total else 0.0
    print(f"{what}: {total:.0f} reads, {share:.0%} served by the replica, fallbacks {fallbacks}")


async def test_a_client_reads_its_own_writes(
    replicated: Replicated, http: aiohttp.ClientSession
) -> None:
    before = await _counted(http, replicated.apis)
    clients = [RawClient(http, replicated.apis, seed=seed) for seed in range(20)]

    async def submit_and_read(client: RawClient) -> None:
        for _ in range(5):
            job_id = await client.submit()
            job = await client.get(job_id)  # through either api process
            assert job["id"] == job_id

    started = time.monotonic()
    async with _lag_sampled(http, replicated.apis, "read-your-writes"):
        await asyncio.gather(*(submit_and_read(client) for client in clients))
    elapsed = time.monotonic() - started

    # The SDK keeps the position per Client instance: each one reads its own submissions.
    sdks = [Client(api, PRODUCER_TOKEN) for api in replicated.apis]
    try:
        for sdk in sdks:
            for _ in range(3):
                submitted = (await sdk.submit(QUEUE, "t", {})).job
                assert (await sdk.get(submitted["id"]))["id"] == submitted["id"]
                assert await sdk.events(submitted["id"])
    finally:
        for sdk in sdks:
            await sdk.close()

    served, fallbacks = _since(await _counted(http, replicated.apis), before)
    _report(f"read-your-writes ({elapsed:.1f}s for 100 submit+read)", served, fallbacks)
    # Both ways were taken: the replica did answer, and reads it could not answer in time
    # went to the primary (and still found their jobs).
    assert served > 0
    assert fallbacks.get("behind", 0) > 0


STATE_ORDER = {"PENDING": 0, "RUNNING": 1, "COMPLETED": 2}
PROGRESS_STEPS = 5


def _how_far(job: dict[str, Any]) -> tuple[int, int]:
    """How far the job has moved (the api shows no version): its state along PENDING,
    RUNNING, COMPLETED, and within RUNNING the progress its worker reported (0, 1, ...)."""
    return STATE_ORDER[job["state"]], job["progress"] or 0


async def test_reads_never_go_backwards(
    replicated: Replicated, http: aiohttp.ClientSession
) -> None:
    queue = "replica-moved"  # the one job the mover claims is the first of its queue
    before = await _counted(http, replicated.apis)
    mover = RawClient(http, replicated.apis, queue=queue)
    job_id = await mover.submit()
    readers = [RawClient(http, replicated.apis, seed=seed, queue=queue) for seed in range(4)]
    seen: list[list[tuple[int, int]]] = [[] for _ in readers]
    final = (STATE_ORDER["COMPLETED"], PROGRESS_STEPS)

    async def read(index: int) -> None:
        reader, steps = readers[index], seen[index]
        while not steps or steps[-1] < final:
            if len(steps) % 4 == 0:
                # A write of its own puts the reader's position ahead of the standby: its
                # next read goes to the primary (the first api process waits 200 ms) or
                # waits for the standby (the second); either way it must not go back.
                await reader.submit()
            # Without a position yet (it never read the job), the reader may not find it:
            # reads without Evora-Read-After are eventual. Once found, it stays found.
            job = await reader.find(job_id)
            if job is None:
                assert not steps, f"reader {index} lost the job after {steps}"
                continue
            step = _how_far(job)
            assert not steps or step >= steps[-1], (
                f"reader {index} read {step} after {steps[-1]}: it went backwards"
            )
            steps.append(step)

    async def move() -> None:
        async with http.post(
            replicated.dispatcher + "/v1/claim",
            json={"worker_id": "w-replica", "queues": [queue], "wait_seconds": 5},
            headers=WORKER_HEADERS,
        ) as response:
            assert response.status == 200
            [claimed] = (await response.json())["jobs"]
        assert claimed["id"] == job_id
        lease = {"lease_token": claimed["lease_token"]}
        for progress in range(1, PROGRESS_STEPS + 1):
            await asyncio.sleep(0.3)  # readers read each step a while
            async with http.post(
                f"{replicated.dispatcher}/v1/jobs/{job_id}/heartbeat",
                json={**lease, "progress": progress},
                headers=WORKER_HEADERS,
            ) as response:
                assert response.status == 200
        async with http.post(
            f"{replicated.dispatcher}/v1/jobs/{job_id}/complete",
            json={**lease, "result": {"ok": True}},
            headers=WORKER_HEADERS,
        ) as response:
            assert response.status == 200

    async with _lag_sampled(http, replicated.apis, "monotonic reads"):
        await asyncio.wait_for(asyncio.gather(move(), *(read(i) for i in range(len(readers)))), 60)
    served, fallbacks = _since(await _counted(http, replicated.apis), before)
    _report("monotonic reads", served, fallbacks)
    print("steps each reader saw:", [sorted(set(steps)) for steps in seen])
    assert served > 0
    assert fallbacks.get("behind", 0) > 0


async def test_a_replica_lagging_beyond_the_bound_answers_nobody(
    replicated: Replicated, children: Children, http: aiohttp.ClientSession
) -> None:
    # An api that tolerates less lag than the standby's apply delay: while writes stream,
    # the standby is ~500 ms behind, and even reads without a position (which need nothing
    # in particular) go to the primary; once the writes stop and it catches up, it answers.
    port = free_port()
    await spawn_service(
        children,
        http,
        replicated.primary.dsn(replicated.database),
        "api",
        port,
        EVORA_READ_DATABASE_URL=replicated.standby.dsn(replicated.database),
        EVORA_READ_REPLICA_MAX_LAG="0.2",
    )
    strict = f"http://127.0.0.1:{port}"
    writer = RawClient(http, replicated.apis)
    job_id = await writer.submit()
    stop = asyncio.Event()

    async def write() -> None:
        while not stop.is_set():
            await writer.submit()
            await asyncio.sleep(0.02)

    async def read_without_position() -> dict[str, float]:
        async with http.get(f"{strict}/v1/jobs/{job_id}", headers=PRODUCER) as response:
            assert response.status in (200, 404)  # eventual, but never a 5xx
        return (await _counted(http, [strict]))[1]

    writing = asyncio.create_task(write())
    try:

        async def lag_fallback() -> bool:
            return (await read_without_position()).get("lag", 0) > 0

        await until(lag_fallback, "a read skips the lagging standby", within=30)
    finally:
        stop.set()
        await writing
    served, fallbacks = await _counted(http, [strict])
    _report("max lag 0.2 s, writes streaming", served, fallbacks)
    print("lag the strict api measured:", await _lags(http, [strict]))

    async def served_again() -> bool:
        await read_without_position()
        return (await _counted(http, [strict]))[0] > served

    await until(served_again, "the caught-up standby answers again", within=30)


async def test_a_stopped_standby_sends_reads_to_the_primary(
    replicated: Replicated, http: aiohttp.ClientSession
) -> None:
    queue = "replica-stopped"  # listed below: this test's job alone
    start = await _counted(http, replicated.apis)
    client = RawClient(http, replicated.apis, queue=queue)
    job_id = await client.submit()
    await client.get(job_id)
    _, before = await _counted(http, replicated.apis)

    await asyncio.to_thread(replicated.standby.stop)
    for _ in range(10):
        assert (await client.get(job_id))["id"] == job_id
    async with http.get(
        replicated.apis[0] + "/v1/jobs",
        params={"queue": queue},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as response:
        assert response.status == 200
        assert [job["id"] for job in (await response.json())["jobs"]] == [job_id]
    sdk = Client(replicated.apis[0], PRODUCER_TOKEN)
    try:
        assert (await sdk.get(job_id))["id"] == job_id
    finally:
        await sdk.close()

    served, after = await _counted(http, replicated.apis)
    _report("standby stopped", *_since((served, after), start))
    assert after.get("unavailable", 0) > before.get("unavailable", 0)

    # Back up, the replica answers again (it is left alone for a second after failing).
    await asyncio.to_thread(replicated.standby.start)

    async def replica_serves() -> bool:
        await client.get(job_id)
        now_served, _ = await _counted(http, replicated.apis)
        return now_served > served

    await until(replica_serves, "the restarted standby serves reads", within=30)
