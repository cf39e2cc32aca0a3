"""`evora.Client` when the network or the server fails: answers a real api does not give on
demand (a 503 for one request, an answer lost after the work was done, a slow answer), staged
by the fake server of tests/sdk/proxy.py."""

from __future__ import annotations

import socket

import pytest

import evora
from evora import Client
from tests.sdk.conftest import FAST
from tests.sdk.fake import FaultProxy
from tests.servers import PRODUCER_TOKEN

JOB_ROUTE = "/v1/jobs/{id}"


async def test_reads_are_retried_on_503(proxied_client: Client, proxy: FaultProxy) -> None:
    job_id = (await proxied_client.submit("q", "t")).id
    proxy.fault("GET", JOB_ROUTE, 503)
    proxy.fault("GET", JOB_ROUTE, 502)
    assert (await proxied_client.get(job_id))["id"] == job_id
    assert len(proxy.seen("GET", JOB_ROUTE)) == 3


async def test_retries_are_bounded(proxied_client: Client, proxy: FaultProxy) -> None:
    for _ in range(5):
        proxy.fault("GET", JOB_ROUTE, 503)
    with pytest.raises(evora.ServerError) as caught:
        await proxied_client.get("00000000-0000-4000-8000-000000000000")
    assert (caught.value.status, caught.value.attempts) == (503, 3)  # retries=2
    assert len(proxy.seen("GET", JOB_ROUTE)) == 3


async def test_4xx_and_500_are_not_retried(proxied_client: Client, proxy: FaultProxy) -> None:
    proxy.fault("GET", JOB_ROUTE, 500)
    with pytest.raises(evora.ServerError):
        await proxied_client.get("00000000-0000-4000-8000-000000000000")
    with pytest.raises(evora.JobNotFoundError):
        await proxied_client.get("00000000-0000-4000-8000-000000000000")
    assert len(proxy.seen("GET", JOB_ROUTE)) == 2


async def test_submit_without_key_is_not_repeated(
    proxied_client: Client, proxy: FaultProxy
) -> None:
    proxy.fault("POST", "/v1/jobs", 503, after=True)
    with pytest.raises(evora.ServerError):
        await proxied_client.submit("q", "t")
    assert len(proxy.seen("POST", "/v1/jobs")) == 1
    # the server did create it: repeating would have made two
    assert len((await proxied_client.list_jobs()).jobs) == 1


async def test_submit_with_key_is_repeated_and_reports_the_replay(
    proxied_client: Client, proxy: FaultProxy
) -> None:
    proxy.fault("POST", "/v1/jobs", 503, after=True)
    result = await proxied_client.submit("q", "t", idempotency_key="once")
    assert result.replayed and len((await proxied_client.list_jobs()).jobs) == 1
    assert len(proxy.seen("POST", "/v1/jobs")) == 2


async def test_batch_is_repeated_only_when_every_item_has_a_key(
    proxied_client: Client, proxy: FaultProxy
) -> None:
    proxy.fault("POST", "/v1/jobs/batch", 503)
    with pytest.raises(evora.ServerError):
        await proxied_client.submit_batch(
            [{"queue": "q", "type": "t", "idempotency_key": "a"}, {"queue": "q", "type": "t"}]
        )
    proxy.fault("POST", "/v1/jobs/batch", 503)
    results = await proxied_client.submit_batch(
        [
            {"queue": "q", "type": "t", "idempotency_key": "a"},
            {"queue": "q", "type": "t", "idempotency_key": "b", "payload": [1]},
        ]
    )
    assert [r.replayed for r in results] == [False, False]
    assert results[1].job["payload"] == [1]
    assert len(proxy.seen("POST", "/v1/jobs/batch")) == 3


async def test_admin_retry_is_not_repeated(proxied_client: Client, proxy: FaultProxy) -> None:
    proxy.fault("POST", "/v1/jobs/{id}/retry", 503)
    with pytest.raises(evora.ServerError):
        await proxied_client.retry("00000000-0000-4000-8000-000000000000")
    assert len(proxy.seen("POST", "/v1/jobs/{id}/retry")) == 1


async def test_a_repeated_cancel_that_finds_its_own_work_returns_the_job(
    proxied_client: Client, proxy: FaultProxy
) -> None:
    job_id = (await proxied_client.submit("q", "t")).id
    proxy.fault("POST", "/v1/jobs/{id}/cancel", 504, after=True)  # cancelled, answer lost
    job = await proxied_client.cancel(job_id)
    assert job["state"] == "CANCELLED"
    assert len(proxy.seen("POST", "/v1/jobs/{id}/cancel")) == 2


async def test_connection_refused_is_retried_even_for_submit() -> None:
    with socket.socket() as probe:  # a port nothing listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with Client(f"http://127.0.0.1:{port}", "t", retries=2, retry_backoff=FAST) as client:
        with pytest.raises(evora.EvoraConnectionError) as caught:
            await client.submit("q", "t")
    assert caught.value.attempts == 3 and not caught.value.request_sent


async def test_timeouts_bound_every_call(proxy: FaultProxy) -> None:
    proxy.fault("GET", JOB_ROUTE, 200, delay=5)
    async with Client(proxy.url, PRODUCER_TOKEN, timeout=0.2, retries=0) as client:
        with pytest.raises(evora.EvoraConnectionError) as caught:
            await client.get("00000000-0000-4000-8000-000000000000")
    assert caught.value.request_sent
