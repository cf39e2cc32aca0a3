"""What one hostile body can cost a service, measured as the peak RSS of a real `evora api`
or `evora dispatcher` process.

The bodies are within every byte limit (15 payloads of just under 1 MiB each), but each
byte of `[[[...]]]` becomes ~40 bytes of Python objects once parsed: before the value
budget, the batch below took the api from ~140 MB to ~1 GB RSS and the acks the dispatcher
to ~2 GB. Now both are refused before parsing, at about the cost of holding the body.
"""

from __future__ import annotations

import asyncio
import uuid

import aiohttp
import orjson

from evora.protocol.bounds import MIB
from tests.e2e.conftest import WORKER_HEADERS
from tests.edge.conftest import Running, StartService
from tests.servers import PRODUCER_TOKEN

# Far below the ~850 MB the batch used to cost; holding a 15 MiB body (and one copy of it
# without its strings) is the expected cost.
PEAK_GROWTH_BOUND_MIB = 100
PAYLOADS = 15


def nested_payload(size: int = 1_000_000) -> bytes:
    """About `size` bytes of lists nested 100 deep: the most objects per byte."""
    unit = b"[" * 100 + b"]" * 100
    return b"[" + b",".join([unit] * (size // (len(unit) + 1))) + b"]"


async def peak_growth(
    service: Running, http: aiohttp.ClientSession, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, float]:
    service.reset_peak_rss()
    before = service.rss_mib()
    async with http.post(
        service.url + path,
        data=body,
        headers={**headers, "Content-Type": "application/json"},
    ) as response:
        status = response.status
        await response.read()
    return status, service.peak_rss_mib() - before


async def test_a_batch_of_nested_payloads_is_refused_before_parsing(
    start_service: StartService, http: aiohttp.ClientSession
) -> None:
    api = await start_service("api")
    payload = nested_payload()
    job = b'{"queue":"mem","type":"t","payload":' + payload + b"}"
    body = b'{"jobs":[' + b",".join([job] * PAYLOADS) + b"]}"
    headers = {"Authorization": f"Bearer {PRODUCER_TOKEN}"}

    status, growth = await peak_growth(api, http, "/v1/jobs/batch", body, headers)

    print(f"api: {len(body) / 2**20:.1f} MiB batch, peak RSS growth {growth:.0f} MiB")
    assert status == 413
    assert growth < PEAK_GROWTH_BOUND_MIB


async def test_acks_with_nested_results_are_refused_before_parsing(
    start_service: StartService, http: aiohttp.ClientSession
) -> None:
    dispatcher = await start_service("dispatcher")
    result = nested_payload()
    acks = [
        b'{"id":"%s","lease_token":"%s","outcome":"complete","result":%s}'
        % (str(uuid.uuid4()).encode(), str(uuid.uuid4()).encode(), result)
        for _ in range(PAYLOADS)
    ]
    body = b'{"acks":[' + b",".join(acks) + b"]}"

    status, growth = await peak_growth(dispatcher, http, "/v1/acks", body, WORKER_HEADERS)

    print(f"dispatcher: {len(body) / 2**20:.1f} MiB acks, peak RSS growth {growth:.0f} MiB")
    assert status == 413
    assert growth < PEAK_GROWTH_BOUND_MIB


async def test_the_largest_accepted_payload_costs_a_bounded_amount(
    start_service: StartService, http: aiohttp.ClientSession
) -> None:
    """The most expensive body that is accepted: one payload of the largest size, all
    empty lists. What it costs is what a deployment must budget per concurrent request."""
    api = await start_service("api")
    payload = b"[" + b",".join([b"[]"] * 349_000) + b"]"
    assert len(payload) < 1_048_576
    body = orjson.dumps({"jobs": [{"queue": "mem", "type": "t"}]}).replace(
        b'"t"}', b'"t","payload":' + payload + b"}"
    )
    headers = {"Authorization": f"Bearer {PRODUCER_TOKEN}"}

    status, growth = await peak_growth(api, http, "/v1/jobs/batch", body, headers)

    print(f"api: largest accepted payload, peak RSS growth {growth:.0f} MiB")
    assert status == 200
    assert growth < 2 * PEAK_GROWTH_BOUND_MIB


CONCURRENT = 16
BATCH_ITEMS = 1000
PAYLOAD_CHARS = 8000


def batch_refused_after_parsing() -> bytes:
    """A batch of about 8 MiB that is parsed in full and then refused: every item valid but
    the last, whose queue name is not one (so nothing reaches the database)."""
    text = "x" * PAYLOAD_CHARS
    items = [{"queue": "mem", "type": "t", "payload": {"text": text}}] * (BATCH_ITEMS - 1)
    items.append({"queue": "not a queue name", "type": "t", "payload": {"text": text}})
    return orjson.dumps({"jobs": items})


async def concurrent_peak_growth(
    service: Running, http: aiohttp.ClientSession, body: bytes
) -> tuple[list[int], float]:
    headers = {"Authorization": f"Bearer {PRODUCER_TOKEN}", "Content-Type": "application/json"}
    service.reset_peak_rss()
    before = service.rss_mib()

    async def post() -> int:
        async with http.post(service.url + "/v1/jobs/batch", data=body, headers=headers) as r:
            await r.read()
            return r.status

    statuses = await asyncio.gather(*(post() for _ in range(CONCURRENT)))
    return sorted(statuses), service.peak_rss_mib() - before


async def test_the_body_budget_bounds_what_concurrent_batches_cost_the_process(
    start_service: StartService, http: aiohttp.ClientSession
) -> None:
    """Sixteen clients send an 8 MiB batch at once. With room for all of them (a budget of 512
    MiB) the api holds sixteen bodies and their parsed items at once; with the smallest budget
    the default limits allow (32 MiB: 16 for bodies, two of these; 16 for parsing, one) the
    others wait their turn, and the process grows by a fraction of that. Each request is
    still answered in full."""
    body = batch_refused_after_parsing()
    roomy = await start_service("api", EVORA_BODY_BUDGET_BYTES=str(512 * MIB))
    roomy_statuses, roomy_growth = await concurrent_peak_growth(roomy, http, body)
    tight = await start_service("api", EVORA_BODY_BUDGET_BYTES=str(32 * MIB))
    tight_statuses, tight_growth = await concurrent_peak_growth(tight, http, body)

    print(
        f"api: {CONCURRENT} x {len(body) / MIB:.1f} MiB batches at once, peak RSS growth "
        f"{roomy_growth:.0f} MiB with a 512 MiB budget, {tight_growth:.0f} MiB with 32 MiB"
    )
    assert roomy_statuses == tight_statuses == [422] * CONCURRENT
    assert tight_growth < roomy_growth / 2
