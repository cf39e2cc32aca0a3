"""The real `evora api` and `evora dispatcher` as child processes on a real PostgreSQL, for
schema-driven fuzzing: schemathesis sends its requests from the test thread with blocking
`requests`, so the servers must not share the test's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.api.conftest import shared_client
from tests.e2e.conftest import (
    ADMIN_TOKEN,
    TOKENS,
    Child,
    Children,
    child_env,
    evora_command,
    free_port,
    module_db_url,
    until,
)

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
