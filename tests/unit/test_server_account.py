"""The account PostgreSQL runs as when we are root, created once by however many processes
start a server at the same moment (pytest's workers, replicated services under `evora dev`)."""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

PROCESSES = 6

# Only root creates the account. CI runs as root with useradd, and there this test never
# skips: run otherwise, it fails.
pytestmark = pytest.mark.skipif(
    "CI" not in os.environ
    and (os.geteuid() != 0 or shutil.which("useradd", path="/usr/sbin:/sbin:/usr/bin") is None),
    reason="only root creates the account",
)


@pytest.fixture
def account_name() -> Iterator[str]:
    name = f"evora-t{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(["userdel", name], capture_output=True, check=False)
    subprocess.run(["groupdel", name], capture_output=True, check=False)


async def test_processes_creating_the_account_at_once_all_get_the_one_account(
    account_name: str,
) -> None:
    # Without the lock around useradd, four useradd of one name at once all exit 0 here, each
    # writing its own uid: the processes then disagree, and the uid some read is gone.
    # Each process imports first and creates the account when a line arrives on its stdin,
    # the same moment for all.
    program = (
        "import sys; from evora.embedded._runas import server_account; print(flush=True); "
        "sys.stdin.readline(); a = server_account(sys.argv[1]); print(a.uid, a.gid)"
    )
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            program,
            account_name,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for _ in range(PROCESSES)
    ]
    for p in processes:
        assert p.stdout is not None
        await p.stdout.readline()  # imported
    answers = await asyncio.gather(*(p.communicate(b"go\n") for p in processes))
    outputs = [out.decode().split() for out, _ in answers]
    assert all(p.returncode == 0 for p in processes)
    entry = pwd.getpwnam(account_name)
    assert outputs == [[str(entry.pw_uid), str(entry.pw_gid)]] * PROCESSES
    accounts = [entry.pw_name for entry in pwd.getpwall()]
    assert accounts.count(account_name) == 1
