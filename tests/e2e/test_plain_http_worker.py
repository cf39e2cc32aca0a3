"""The plain HTTP reference worker (examples/plain_http_worker.py: aiohttp and JSON, no SDK)
as a process of its own against the real api and dispatcher: it drains a few hundred jobs,
and an outcome it carries with a lease token that is no longer the job's is answered 409 for
that item only, the rest of its batch recorded."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

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
    """The command running that worker on queue `plain` of `stack`."""
    return [
        *(sys.executable, "-c", HOLDING_WORKER, str(EXAMPLE)),
        *(stack.dispatcher_url, WORKER_TOKEN, "plain", *options),
    ]


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
        child_env(),
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
        child_env(),
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
        child_env(),
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
