"""A handler that raises evora.Snooze(seconds): the worker snoozes the job (POST
/v1/jobs/{id}/snooze), which runs again after the delay without using up an attempt."""

from __future__ import annotations

import evora
from evora import Client
from evora.storage.jobs import JobStore
from tests.polling import until
from tests.sdk.fake import FaultProxy
from tests.sdk.test_worker import in_state, make_worker, serving, stored

SNOOZES = 3
DELAY = 0.2


async def test_a_handler_snoozes_without_using_up_attempts(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    worker = make_worker(proxy)
    runs: list[tuple[int, int]] = []

    @worker.handler("poll")
    async def poll(job: evora.Job) -> str:
        runs.append((job.attempt, job.snoozes))
        if len(runs) <= SNOOZES:
            raise evora.Snooze(DELAY)
        return "ready"

    job_id = (await client.submit("q", "poll", max_attempts=1)).id
    async with serving(worker):
        await until(in_state(store, job_id, "COMPLETED"))
    job = await stored(store, job_id)
    assert (job["attempt"], job["snoozes"], job["result"]) == (1, SNOOZES, "ready")
    assert runs == [(1, n) for n in range(SNOOZES + 1)]
    sent = proxy.seen("POST", "/v1/jobs/{id}/snooze")
    assert [s.body["delay_seconds"] for s in sent] == [DELAY] * SNOOZES
    events = [e["event"] for e in await store.events(job["id"])]
    assert events == ["submitted", *["claimed", "snoozed"] * SNOOZES, "claimed", "completed"]
