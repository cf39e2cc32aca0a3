"""The plain HTTP reference worker (examples/plain_http_worker.py: aiohttp and JSON, no SDK)
as a process of its own against the real api and dispatcher: it drains a few hundred jobs,
and an outcome it carries with a lease token that is no longer the job's is answered 409 for
that item only, the rest of its batch recorded."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from urllib.parse import urlsplit

from tests.e2e.conftest import WORKER_HEADERS, Child, Children, Stack, child_env
from tests.servers import WORKER_TOKEN

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "plain_http_worker.py"

# The example's own loop with a handler that holds a job whose payload names a file until
# that file exists, so the test can take the job's lease away while it runs; it writes
# `<file>.started` first, when the worker has the job (RUNNING in PostgreSQL comes before:
# the claim's answer may still be on its way).
HOLDING_WORKER = """
import asyncio, os, runpy, sys
example = runpy.run_path(sys.argv[1])
async def work(job):
    hold = job["payload"].get("hold")
    if hold:
        open(hold + ".started", "w").close()
    while hold and not os.path.exists(hold):
        await asyncio.sleep(0.01)
    return job["payload"]
example["main"](sys.argv[2:], work)
"""

JOBS = 300


async def started(stack: Stack, worker: Child, hold: Path) -> None:
    """Until the held job's handler runs in `worker`."""
    marker = hold.with_name(hold.name + ".started")

    def running() -> bool:
        assert worker.running, worker.output()
        return marker.exists()

    await stack.until(running, within=30, what="the held job's handler runs")


def holding_worker(stack: Stack, *options: str) -> list[str]:
    """The command running that worker on queue `plain` of `stack` (its token in
    `worker_env()`)."""
    return [
        *(sys.executable, "-c", HOLDING_WORKER, str(EXAMPLE)),
        *(stack.dispatcher_url, "plain", *options),
    ]


def worker_env() -> dict[str, str]:
    return child_env(EVORA_WORKER_TOKEN=WORKER_TOKEN)


async def test_plain_worker_drains_and_a_stale_ack_is_refused_alone(
    stack: Stack, children: Children, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    held = await stack.client.submit("plain", "plain.echo", {"hold": str(gate)})
    batch = await stack.client.submit_batch(
        [{"queue": "plain", "type": "plain.echo", "payload": {"i": i}} for i in range(JOBS)],
        return_jobs=False,
    )
    held_id = held.id
    worker = await children.spawn(
        "plain-worker",
        holding_worker(stack, "--max-jobs", "50", "--wait-seconds", "1"),
        worker_env(),
    )

    await started(stack, worker, gate)
    # Another worker's view: the lease the plain worker holds is handed back, so the token
    # it will ack with is stale. The job runs again (on the other lane) once released.
    token = await stack.pool.fetchval(
        "SELECT lease_token::text FROM evora.jobs WHERE id = $1", held_id
    )
    async with stack.http.post(
        f"{stack.dispatcher_url}/v1/jobs/{held_id}/release",
        json={"lease_token": token},
        headers=WORKER_HEADERS,
    ) as response:
        assert response.status == 200, await response.text()
    gate.touch()

    await stack.wait_for_states("plain", {"COMPLETED": JOBS + 1}, within=60)
    attempts = dict(
        await stack.pool.fetch(
            "SELECT id::text, attempt FROM evora.jobs WHERE queue = 'plain'",
        )
    )
    assert set(attempts) == {held_id} | {receipt.id for receipt in batch}
    assert set(attempts.values()) == {1}  # a release does not use up an attempt
    assert await stack.event_names(held_id) == [
        "submitted",
        "claimed",
        "released",
        "claimed",
        "completed",  # by the second run: the first one's outcome was refused
    ]

    # The stale outcome rode with 49 others in one claim: only its item was refused. Polled:
    # the refusal is printed when that claim answers, which may be after its long-poll wait,
    # while the other lane's ack of the second run is already recorded.
    def refused() -> list[str]:
        return [line for line in worker.output().splitlines() if "outcome refused" in line]

    await stack.until(lambda: bool(refused()), within=30, what="the stale outcome is refused")
    assert refused() == [f"job {held_id}: outcome refused (409)"]

    worker.send(signal.SIGTERM)
    assert await worker.wait(within=15) == 0, worker.output()


async def test_plain_worker_releases_what_it_holds_on_sigterm(
    stack: Stack, children: Children, tmp_path: Path
) -> None:
    never = tmp_path / "never"
    held = await stack.client.submit("plain", "plain.echo", {"hold": str(never)})
    worker = await children.spawn(
        "plain-worker",
        holding_worker(stack, "--grace-seconds", "0.5"),
        worker_env(),
    )
    await started(stack, worker, never)
    worker.send(signal.SIGTERM)
    assert await worker.wait(within=15) == 0, worker.output()

    # Polled: the other lane's long-poll, dropped on SIGTERM, may still be held by the
    # dispatcher when the job is released, claim it and release it again as undeliverable.
    async def released() -> bool:
        job = await stack.pool.fetchrow(
            "SELECT state::text AS state, attempt FROM evora.jobs WHERE id = $1", held.id
        )
        return bool((job["state"], job["attempt"]) == ("PENDING", 0))  # released, not failed

    await stack.until(released, within=10, what="the held job is PENDING, its attempt unused")


async def test_plain_worker_heartbeats_and_stops_a_job_cancelled_while_it_runs(
    stack: Stack, children: Children, tmp_path: Path
) -> None:
    held = await stack.client.submit(
        "plain", "plain.echo", {"hold": str(tmp_path / "never")}, lease_seconds=3
    )
    worker = await children.spawn(
        "plain-worker",
        holding_worker(stack),
        worker_env(),
    )
    await stack.wait_for_states("plain", {"RUNNING": 1}, within=30)
    first = await stack.pool.fetchval(
        "SELECT lease_expires_at FROM evora.jobs WHERE id = $1", held.id
    )

    async def extended() -> bool:
        assert worker.running, worker.output()
        now = await stack.pool.fetchval(
            "SELECT lease_expires_at FROM evora.jobs WHERE id = $1", held.id
        )
        return bool(now > first)

    await stack.until(extended, within=10, what="a heartbeat extends the 3 s lease")
    await stack.client.cancel(held.id)
    # The next heartbeat learns of it; the worker stops the handler and releases the job.
    await stack.wait_for_states("plain", {"CANCELLED": 1}, within=10)
    events = await stack.event_names(held.id)
    assert events == ["submitted", "claimed", "cancel_requested", "cancelled"]
    worker.send(signal.SIGTERM)
    assert await worker.wait(within=15) == 0, worker.output()


# What a loaded or restarting dispatcher, or the network, does to a connection, one fault
# per connection in this order: closed once the request arrived, unanswered; answered 503;
# its answer cut short (a long-poll that found nothing: no job is stranded unanswered).
FAULTS = ("cut", "503", "cut-answer")
UNAVAILABLE = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class FaultyFront:
    """A TCP proxy in front of the dispatcher that spoils its first connections with
    `FAULTS`, then passes the rest through."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.faults = list(FAULTS)
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def serve(self, client: asyncio.StreamReader, to_client: asyncio.StreamWriter) -> None:
        fault = self.faults.pop(0) if self.faults else None
        server, to_server = await asyncio.open_connection(
            self.upstream.hostname, self.upstream.port
        )
        try:
            request = await client.read(65536)
            if fault == "503":
                to_client.write(UNAVAILABLE)
            elif fault != "cut":
                to_server.write(request)
                cut_after = 64 if fault == "cut-answer" else None
                pipes = {
                    asyncio.ensure_future(pipe(client, to_server)),
                    asyncio.ensure_future(pipe(server, to_client, cut_after)),
                }
                # Either side closing, or the answer cut, ends the connection for both.
                _, pending = await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
                for task in pending:
                    task.cancel()
        finally:
            for writer in (to_client, to_server):
                writer.close()


async def pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cut_after: int | None = None
) -> None:
    """Copies until the reader's side closes, or only the first `cut_after` bytes."""
    while data := await reader.read(cut_after or 65536):
        writer.write(data)
        await writer.drain()
        if cut_after is not None:
            return


async def test_plain_worker_outlives_connections_cut_and_a_503(
    stack: Stack, children: Children
) -> None:
    front = FaultyFront(stack.dispatcher_url)
    url = await front.start()
    try:
        # Claims of 1 s long-polls on an empty queue: each lane meets the faults first.
        worker = await children.spawn(
            "plain-worker",
            [sys.executable, str(EXAMPLE), url, "plain", "--wait-seconds", "1"],
            worker_env(),
        )

        def spent() -> bool:
            assert worker.running, worker.output()
            return worker.output().count("claim failed") == len(FAULTS)

        await stack.until(spent, within=30, what="each fault failed a claim, tried again")
        await stack.client.submit_batch(
            [{"queue": "plain", "type": "plain.echo", "payload": {"i": i}} for i in range(50)],
            return_jobs=False,
        )
        await stack.wait_for_states("plain", {"COMPLETED": 50}, within=60)
        assert worker.running, worker.output()
        assert WORKER_TOKEN not in worker.output()  # its failures are logged without it
        worker.send(signal.SIGTERM)
        assert await worker.wait(within=15) == 0, worker.output()
    finally:
        front.close()
