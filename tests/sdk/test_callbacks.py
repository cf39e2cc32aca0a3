"""A handler that suspends its job on a callback (`await job.suspend(...)`, docs/callbacks.md):
the worker stops its heartbeats and reports nothing; `Client.resolve_callback` resumes the job,
whose next run reads the payload from `job.callback`."""

from __future__ import annotations

import pytest

import evora
from evora import Client
from evora.storage.jobs import JobStore
from tests.polling import until
from tests.sdk.fake import FaultProxy
from tests.sdk.test_worker import in_state, make_worker, serving, stored
from tests.servers import Services


async def test_a_handler_suspends_and_its_next_run_sees_the_payload(
    proxy: FaultProxy, client: Client, store: JobStore, services: Services
) -> None:
    worker = make_worker(proxy)
    callbacks: list[str] = []
    seen: list[object] = []

    @worker.handler("approve")
    async def approve(job: evora.Job) -> object:
        seen.append(None if job.callback is None else job.callback["payload"])
        if job.callback is None:
            callbacks.append(await job.suspend(timeout_seconds=3600, on_timeout="fail"))
            return None
        return {"approved": job.callback["payload"]["ok"]}

    job_id = (await client.submit("q", "approve", max_attempts=1)).id
    async with serving(worker):
        await until(in_state(store, job_id, "SUSPENDED"))
        # the suspend's answer reaches the handler a moment after the job is SUSPENDED
        await until(lambda: len(callbacks) == 1)
        # a webhook sender needs no token: the callback id is the credential
        async with Client(services.api.url) as sender:
            resolution = await sender.resolve_callback(callbacks[0], {"ok": True})
        assert resolution["payload"] == {"ok": True}
        # a retry answers the same
        assert await client.resolve_callback(callbacks[0], {"ok": False}) == resolution
        await until(in_state(store, job_id, "COMPLETED"))
    job = await stored(store, job_id)
    assert (job["attempt"], job["result"]) == (1, {"approved": True})
    assert seen == [None, {"ok": True}]
    events = [e["event"] for e in await store.events(job["id"])]
    assert events == ["submitted", "claimed", "suspended", "resumed", "claimed", "completed"]
    # the suspended run reported nothing after its suspend
    assert proxy.seen("POST", "/v1/jobs/{id}/complete") == []
    async with Client(services.api.url) as sender:
        with pytest.raises(evora.CallbackNotFoundError):
            await sender.resolve_callback("evcb_" + "0" * 64)
