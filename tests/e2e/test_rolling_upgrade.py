"""A rolling upgrade under load: services of the previous release, on its schema, keep
serving while this release's `evora migrate` runs, and are then replaced one by one by this
release's; nothing fails for good, nothing is lost, and the audit passes (docs/deploy.md,
Upgrades).

Across migration 0030, which moves every table into the schema `evora`, the previous
release's statements stop working at its commit, so that upgrade is not rolling: from a
release before it, the test does what docs/deploy.md says instead (stop the previous
release's services, migrate, start this release's), under the same load and with the same
checks. It runs from two releases: one before 0030 (stopped, migrated, started) and the one
before this (rolled), whose admin listing answers across the roll, and whose cursor this
release's listing goes on from (a release before migration 0068 paged by submit_seq:
tests/integration/test_listing_by_id.py and tests/api/test_admin.py read its cursors)."""

from __future__ import annotations

import asyncio
import itertools
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from evora import Client, Worker
from evora.storage.audit import audit
from tests.cli.commands import REPO
from tests.polling import until
from tests.release_tree import release_env, unpack_release

# The releases upgraded from: one from before migration 0030, and the release before this one
# (the commit this version's work started from). The CI clone has the whole history; a
# shallow one lacks it.
BEFORE_NAMESPACE = "b00318f"
PREVIOUS_RELEASE = "ae14c12"
# The migration that moves Evora's objects into `evora`: an upgrade from a release without
# it stops the previous release's services before migrating.
NAMESPACE_MIGRATION = "shared/evora/storage/migrations/0030_one_namespace.sql"
# The order of the roll: each service is replaced while the others keep running.
SERVICES = ("sweeper", "projector", "dispatcher", "api")
PRODUCER_TOKEN = "upgrade-producer-token"
WORKER_TOKEN = "upgrade-worker-token-0"
ADMIN_TOKEN = "upgrade-admin-token"
TOKENS = f"producer:{PRODUCER_TOKEN},worker:{WORKER_TOKEN},admin:{ADMIN_TOKEN}"
QUEUE = "upgrade"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _has_the_namespace(release: str) -> bool:
    found = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{release}:{NAMESPACE_MIGRATION}"],
        capture_output=True,
        check=False,
    )
    return found.returncode == 0


async def _listed(fleet: Fleet, after: str | None = None) -> tuple[list[str], str | None]:
    """A page of 5 of the queue's jobs from the admin listing (`after` it): their ids and the
    cursor of the next page."""
    params = {"queue": QUEUE, "limit": "5"} | ({"after": after} if after else {})
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{fleet.url('api')}/v1/jobs",
            params=params,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=aiohttp.ClientTimeout(total=30),
        ) as resp,
    ):
        assert resp.status == 200, await resp.text()
        body = await resp.json()
    return [job["id"] for job in body["jobs"]], body["next"]


async def _migrate(tree: Path, env: dict[str, str]) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "evora_services.cli",
        "migrate",
        env=release_env(tree, env),
        cwd=tree,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, out.decode()


@dataclass
class Fleet:
    """The four services, each a child process of one release's tree, on fixed ports."""

    env: dict[str, str]
    logs: Path
    ports: dict[str, int] = field(default_factory=lambda: {s: _free_port() for s in SERVICES})
    running: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}"

    def _spawn(self, service: str, tree: Path) -> subprocess.Popen[bytes]:
        port = {f"EVORA_{service.upper()}_PORT": str(self.ports[service])}
        with (self.logs / f"{service}-{tree.name}.log").open("ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "evora_services.cli", service],
                env=release_env(tree, {**self.env, **port}),
                cwd=tree,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    async def start(self, service: str, tree: Path) -> None:
        process = self.running[service] = self._spawn(service, tree)

        async def ready() -> bool:
            assert process.poll() is None, f"{service} of {tree} ended; see {self.logs}"
            try:
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(f"{self.url(service)}/readyz") as resp,
                ):
                    return resp.status == 200
            except aiohttp.ClientError:
                return False

        await until(ready, f"{service} of {tree.name} ready", within=60)

    async def stop(self, service: str) -> None:
        process = self.running.pop(service)
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(process.wait, 30)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait)

    async def stop_all(self) -> None:
        for service in list(self.running):
            await self.stop(service)


@pytest.mark.parametrize("release", [BEFORE_NAMESPACE, PREVIOUS_RELEASE])
async def test_services_roll_to_this_release_under_load_after_its_migrations(
    release: str, empty_db_url: str, mongo_url: str, mongo_db_name: str, tmp_path: Path
) -> None:
    previous = unpack_release(release, tmp_path / "previous")
    rolling = _has_the_namespace(release)
    env = {
        "EVORA_DATABASE_URL": empty_db_url,
        "EVORA_MONGO_URL": mongo_url,
        "EVORA_MONGO_DB": mongo_db_name,
        "EVORA_TOKENS": TOKENS,
    }
    await _migrate(previous, env)
    fleet = Fleet(env, tmp_path)
    accepted: dict[str, str] = {}  # idempotency key -> job id
    failures: list[str] = []  # every attempt that failed (and was tried again)
    stop_producing = asyncio.Event()

    async def produce(producer: int) -> None:
        async with Client(fleet.url("api"), PRODUCER_TOKEN) as client:
            for n in itertools.count():
                if stop_producing.is_set():
                    return
                key = f"p{producer}-{n}"
                while key not in accepted:  # the same key again until it is accepted
                    try:
                        result = await client.submit(QUEUE, "t", {"n": n}, idempotency_key=key)
                        accepted[key] = result.job["id"]
                    except Exception as error:  # counted, tried again
                        failures.append(f"{key}: {error!r}")
                        await asyncio.sleep(0.1)
                await asyncio.sleep(0.01)

    worker = Worker(fleet.url("dispatcher"), WORKER_TOKEN, [QUEUE], 8, wait_seconds=1)

    @worker.handler("t")
    async def handle(job: Any) -> dict[str, int]:
        return {"done": 1}

    # Reads `jobs` where the previous release keeps it and, from 0030 on, in `evora`.
    conn = await asyncpg.connect(empty_db_url, server_settings={"search_path": "evora, public"})
    try:

        async def completed_at_least(count: int) -> bool:
            done = await conn.fetchval(
                "SELECT count(*) FROM jobs WHERE queue = $1 AND state = 'COMPLETED'", QUEUE
            )
            return bool(done >= count)

        for service in SERVICES:
            await fleet.start(service, previous)
        working = asyncio.create_task(worker.serve())
        producing = [asyncio.create_task(produce(p)) for p in range(2)]
        try:
            await until(partial(completed_at_least, 50), "load on the previous release", within=30)
            if rolling:
                first, cursor = await _listed(fleet)
                await _migrate(REPO, env)  # this release's migrations, under the old services
                await until(partial(completed_at_least, len(accepted) + 50), "after migrating")
                # rows inserted from here on leave half of their page free (migration 0069)
                options = await conn.fetchval(
                    "SELECT reloptions FROM pg_class WHERE oid = 'evora.jobs'::regclass"
                )
                assert "fillfactor=50" in options
                # the previous release's listing answers on the migrated schema
                assert len((await _listed(fleet, cursor))[0]) == 5
                for service in SERVICES:
                    await fleet.stop(service)
                    await fleet.start(service, REPO)
                    await until(
                        partial(completed_at_least, len(accepted)), f"after rolling {service}"
                    )
                # this release's listing goes on from the previous one's cursor, below the
                # first page's newest job
                following, _ = await _listed(fleet, cursor)
                assert len(following) == 5 and max(following) < max(first)
            else:  # the producers and the worker retry while nothing serves
                await fleet.stop_all()
                await _migrate(REPO, env)
                for service in SERVICES:
                    await fleet.start(service, REPO)
                await until(partial(completed_at_least, len(accepted) + 50), "after restarting")
            stop_producing.set()
            await asyncio.gather(*producing)
            await until(partial(completed_at_least, len(accepted)), "every accepted job completed")
        finally:
            stop_producing.set()
            await asyncio.gather(*producing, return_exceptions=True)
            await worker.stop()
            await asyncio.gather(working, return_exceptions=True)
            await fleet.stop_all()

        rows = await conn.fetch(
            "SELECT idempotency_key, id::text AS id, state::text AS state FROM evora.jobs"
            " WHERE queue = $1",
            QUEUE,
        )
        by_key = {row["idempotency_key"]: (row["id"], row["state"]) for row in rows}
        assert len(rows) == len(by_key) == len(accepted)  # one job per key, no other
        assert {key: job for key, (job, _) in by_key.items()} == accepted
        assert {state for _, state in by_key.values()} == {"COMPLETED"}
        report = await audit(conn)
        assert report.ok, report.text()
    finally:
        await conn.close()
    # A submission may find the api restarting (refused connection, or 503 while it drains)
    # and is tried again; nothing else may fail, in the services either (a 500 is logged).
    assert all("EvoraConnectionError" in failure or "503" in failure for failure in failures), (
        failures
    )
    assert await asyncio.to_thread(_logged_errors, tmp_path) == []


def _logged_errors(logs: Path) -> list[str]:
    """What the services logged as errors, but for a background loop's step that a migration
    interrupted and that was retried: a statement asyncpg prepared before the migration
    changed a type it returns (`jobs` gains a column) fails once inside a transaction."""
    return [
        f"{log.name}: {line[:300]}"
        for log in sorted(logs.glob("*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if '"level":"error"' in line
        and not ("InvalidCachedStatementError" in line and "retrying in" in line)
    ]
