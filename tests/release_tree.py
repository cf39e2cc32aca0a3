"""An earlier release's code, unpacked from git, and the environment that runs it with this
repository's venv: the upgrade tests drive a database with the code that wrote it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from evora.storage.migrate import current_version

REPO = Path(__file__).resolve().parents[1]
# the source roots of either layout (`evora_services` moved into `services/`)
CODE_ROOTS = ("shared", "services", "evora_services")


def unpack_release(commit: str, into: Path, roots: tuple[str, ...] = CODE_ROOTS) -> Path:
    """The folders `roots` (those the commit has) of `commit`, unpacked at `into`."""
    found = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if found.returncode != 0:
        pytest.fail(
            f"the earlier release's commit {commit} is not in this clone: the upgrade test "
            "needs the whole history (git fetch --unshallow)"
        )
    listing = ["git", "-C", str(REPO), "ls-tree", "--name-only", commit]
    present = subprocess.run(
        [*listing, *roots], capture_output=True, text=True, check=True
    ).stdout.split()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, *present], capture_output=True, check=True
    ).stdout
    into.mkdir()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def release_env(tree: Path, env: dict[str, str]) -> dict[str, str]:
    """The environment of a child process running `tree`'s code with the repo's venv (run in
    `tree`: `python -m` puts the working directory first on the path)."""
    # either layout: `evora_services` in `services/` or, before it moved, at the top (the cwd)
    path = os.pathsep.join([str(tree / "shared"), str(tree / "services"), str(tree)])
    return {**os.environ, **env, "PYTHONPATH": path}


async def run_release_script(tree: Path, script: str, *args: str) -> Any:
    """`script` run by `tree`'s code in a child process (`python -c script args...`, in
    `tree`): the JSON of the last line it printed."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        *args,
        env=release_env(tree, {}),
        cwd=tree,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 240)
    assert process.returncode == 0, err.decode()
    return json.loads(out.decode().splitlines()[-1])


# Run by a release's own code (run_release_script): migrate an empty database as that release
# does, drive the mixed workload through its JobStore (seed: the second argument), and leave a
# job of each queue RUNNING across an upgrade; prints them (id and lease token). Arguments:
# the database's URL, the seed, the queues.
HISTORY_WITH_RUNNING_JOBS = """
import asyncio, json, sys
from evora.protocol.jobs import JobSubmission
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.migrate import apply_migrations
from tests.projector.workload import mixed_workload

async def main(url, seed, queues):
    await apply_migrations(url)
    pool = await create_pool(url, min_size=1, max_size=4)
    store = JobStore(pool)
    try:
        await mixed_workload(store, pool, jobs=120, queues=queues, seed=seed, rounds=6)
        for queue in queues:
            await store.submit(JobSubmission(queue=queue, type="across"))
        running = await store.claim(worker_id="across", queues=queues, max_jobs=5)
        print(json.dumps([[str(j["id"]), str(j["lease_token"])] for j in running]))
    finally:
        await store.close()
        await pool.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:]))
"""


async def schema_version(url: str) -> int:
    """The newest migration applied to the database at `url` (before an upgrade: what the
    earlier release's code left)."""
    conn = await asyncpg.connect(url, timeout=30)
    try:
        return await current_version(conn)
    finally:
        await conn.close()
