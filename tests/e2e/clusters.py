"""PostgreSQL clusters that e2e tests start themselves (a primary and its standby, a server
to kill -9), made cheaply: in memory, and copied from one migrated cluster.

initdb and Evora's migrations cost seconds of CPU per cluster and the tests that start their
own servers need one or two each; what they check starts once the server is up. So each
pytest process runs initdb and the migrations once, into a cluster it then stops cleanly,
and every test's primary is a copy of that one's files (a cold copy of a cleanly stopped
cluster is a valid cluster: PostgreSQL's own documented file-system backup). All of it lives
under tests/scratch.py's `scratch_dir()` (tmpfs where there is room): initdb, base backups
and checkpoints on the VM's disk waited for it. A kill -9 of PostgreSQL loses nothing that a
disk would have kept: what its processes wrote to their files is in the kernel's page cache
(tmpfs) either way, and a crash test checks what PostgreSQL had written before it died, not
what a disk flushed."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from evora.embedded import LocalPostgres
from evora.storage.migrate import apply_migrations
from tests.scratch import scratch_dir

_migrated: list[Path] = []  # the process's migrated cluster, once made


@contextlib.contextmanager
def cluster_dir(prefix: str) -> Iterator[Path]:
    """A directory for a test's clusters, removed afterwards. Not under pytest's tmp_path:
    other pytest sessions of the machine's user may reset the permissions of its parents,
    which the server's own account must traverse (as tests/conftest.py)."""
    with tempfile.TemporaryDirectory(prefix=prefix, dir=scratch_dir()) as tmp:
        yield Path(tmp)


async def _migrated_cluster() -> Path:
    """The data directory of a cluster with Evora's migrations in its `postgres` database,
    stopped; made on first use, removed when the process exits."""
    if not _migrated:
        root = Path(tempfile.mkdtemp(prefix="evora-test-migrated-", dir=scratch_dir()))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        server = LocalPostgres(root / "data", durable=False)
        await asyncio.to_thread(server.start)
        try:
            await apply_migrations(server.dsn())
        finally:
            # a clean shutdown: the copies start without crash recovery
            await asyncio.to_thread(server.stop)
        _migrated.append(server.data_dir)
    return _migrated[0]


async def migrated_primary(
    data_dir: Path, *, durable: bool = False, log_path: Path | None = None
) -> LocalPostgres:
    """A server (not started) on a copy of the migrated cluster in `data_dir`. `durable` is a
    setting of the running server (fsync and the like), not of its files."""
    source = await _migrated_cluster()
    # cp -a keeps the files' owner: the server's own account when the tests run as root
    await asyncio.to_thread(
        subprocess.run, ["cp", "-a", str(source), str(data_dir)], check=True, timeout=60
    )
    return LocalPostgres(data_dir, durable=durable, log_path=log_path)
