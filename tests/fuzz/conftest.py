"""The real `evora api` and `evora dispatcher` as child processes on a real PostgreSQL, for
schema-driven fuzzing: schemathesis sends its requests with blocking `requests` (from a
thread, so the test's event loop stays free), and the servers run on their own."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage.db import create_pool
from evora.storage.jobs import Failure, JobStore
from tests.api.conftest import shared_client
from tests.e2e.conftest import Child, Children, child_env, evora_command, free_port, module_db_url
from tests.polling import until
from tests.servers import ADMIN_TOKEN, TOKENS

__all__ = ["module_db_url", "shared_client"]  # fixtures these modules use

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture(scope="module")
async def children(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Children]:
    spawned = Children(tmp_path_factory.mktemp("fuzz"))
    try:
        yield spawned
    finally:
        await spawned.close()


async def spawn(
    children: Children, service: str, db_url: str, **variables: str
) -> tuple[Child, str]:
    """`evora <service>` on a free port; returns it and its base URL once /readyz is 200."""
    port = free_port()
    env = child_env(
        EVORA_DATABASE_URL=db_url,
        EVORA_TOKENS=TOKENS,
        EVORA_HOST="127.0.0.1",
        **{f"EVORA_{service.upper()}_PORT": str(port)},
        EVORA_LOG_LEVEL="WARNING",
        **variables,
    )
    child = await children.spawn(service, evora_command(service), env)
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:

        async def ready() -> bool:
            if not child.running:
                raise AssertionError(f"{service} exited early:\n{child.output()}")
            try:
                async with http.get(url + "/readyz") as response:
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        await until(ready, within=30, what=f"the {service} child process is ready")
    return child, url


@dataclass
class Seeded:
    """Jobs put into the database before fuzzing, so that generated requests can name
    real jobs: `leases` are (id, lease token) of RUNNING jobs, `ids` are jobs in every
    state."""

    ids: list[str] = field(default_factory=list)
    leases: list[tuple[str, str]] = field(default_factory=list)


async def seed(db_url: str, *, running: int, each_other_state: int) -> Seeded:
    pool = await create_pool(db_url, min_size=1, max_size=2)
    store = JobStore(pool)
    try:
        count = running + 4 * each_other_state
        submissions = [
            JobSubmission(queue="fuzz", type="seeded", max_attempts=1, lease_seconds=3600)
            for _ in range(count)
        ]
        submitted = await store.submit_batch(submissions)
        claimed = await store.claim(
            worker_id="seeder", queues=["fuzz"], max_jobs=count - each_other_state
        )
        moves: list[Callable[[dict[str, Any]], Awaitable[object]]] = [
            lambda j: store.complete(j["id"], j["lease_token"]),
            lambda j: store.fail(Failure(j["id"], j["lease_token"], "seeded", retryable=False)),
            lambda j: store.cancel(j["id"]),
        ]
        # The jobs the claim left stay PENDING; of the claimed ones, each other final state
        # takes `each_other_state` and the rest stay RUNNING.
        for i, move in enumerate(moves):
            for job in claimed[i * each_other_state : (i + 1) * each_other_state]:
                await move(job)
        rest = claimed[len(moves) * each_other_state :]
        return Seeded(
            ids=[str(s.job["id"]) for s in submitted],
            leases=[(str(j["id"]), str(j["lease_token"])) for j in rest],
        )
    finally:
        await store.close()
        await pool.close()
