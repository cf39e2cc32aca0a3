"""Whatever a worker sends, the dispatcher answers below 500, and every error is
problem+json (docs/http-api.md#errors).

The dispatcher and api run for the whole module on one database. Generated requests mix
real job ids and current lease tokens (held in `Leases`, refilled by claiming real jobs),
so many of them get through validation to PostgreSQL and really move jobs, with random
UUIDs, arbitrary JSON, raw bytes, huge numbers, NUL and lone surrogates. Claims always
wait 0 seconds (or a few hundredths), so nothing hangs.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from evora import Client, Submission
from evora.http.problems import PROBLEM_CONTENT_TYPE
from evora.protocol.bounds import QUEUE_PATTERN, TYPE_PATTERN
from evora.protocol.jobs import Job as JobModel
from evora.protocol.worker import AcksResponse, ClaimResponse, HeartbeatResponse
from tests.e2e.conftest import FAST, WORKER_HEADERS
from tests.servers import PRODUCER_TOKEN, start_api, start_dispatcher

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
QUEUE = "fuzz"
TYPE = "fuzz.job"

# -- what the generated requests refer to ------------------------------------------------


class Ref:
    """A placeholder in a generated body, resolved against the live leases when sent."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __repr__(self) -> str:
        return f"<{self.kind}>"


OWN_ID = Ref("own id")  # the job of this request's lease
OWN_TOKEN = Ref("own token")  # ... and its current lease token
OTHER_TOKEN = Ref("another job's token")
KNOWN_ID = Ref("some job id, maybe finished")
SPENT_TOKEN = Ref("a token that was current once")


@dataclass
class Leases:
    """Jobs this module holds a lease on (RUNNING), and what it has seen before."""

    current: dict[str, str] = field(default_factory=dict)  # id -> lease token
    known_ids: list[str] = field(default_factory=list)
    spent: list[str] = field(default_factory=list)

    def take(self, rng: random.Random) -> tuple[str, str]:
        job_id = rng.choice(sorted(self.current))
        return job_id, self.current[job_id]

    def claimed(self, jobs: list[dict[str, Any]]) -> None:
        for job in jobs:
            if job["queue"] == QUEUE:
                self.current[str(job["id"])] = str(job["lease_token"])

    def ended(self, job_id: str) -> None:
        token = self.current.pop(job_id, None)
        if token is not None:
            self.spent.append(token)


@dataclass
class Target:
    http: aiohttp.ClientSession
    url: str
    client: Client
    leases: Leases

    async def refill(self) -> None:
        """Keep a few real leases around: claim real jobs, submitting more when needed."""
        for _ in range(2):
            if len(self.leases.current) >= 8:
                return
            body = {"worker_id": "fuzz-seed", "queues": [QUEUE], "max_jobs": 16}
            async with self.http.post(
                self.url + "/v1/claim", json={**body, "wait_seconds": 0}, headers=WORKER_HEADERS
            ) as response:
                assert response.status == 200, await response.text()
                self.leases.claimed((await response.json())["jobs"])
            if len(self.leases.current) < 8:
                batch: list[Submission] = [
                    {"queue": QUEUE, "type": TYPE, "payload": {"i": i}, "max_attempts": 1000}
                    for i in range(32)
                ]
                submitted = await self.client.submit_batch(batch)
                self.leases.known_ids.extend(r.id for r in submitted)

    def resolve(self, value: Any, own: tuple[str, str], rng: random.Random) -> Any:
        if isinstance(value, Ref):
            if value is OWN_ID:
                return own[0]
            if value is OWN_TOKEN:
                return own[1]
            if value is OTHER_TOKEN:
                return self.leases.take(rng)[1]
            if value is KNOWN_ID:
                return rng.choice(self.leases.known_ids)
            assert value is SPENT_TOKEN
            return rng.choice(self.leases.spent) if self.leases.spent else own[1]
        if isinstance(value, dict):
            return {k: self.resolve(v, own, rng) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v, own, rng) for v in value]
        return value


@pytest.fixture(scope="module")
async def target(module_db_url: str) -> AsyncIterator[Target]:
    api = await start_api(module_db_url)
    dispatcher = await start_dispatcher(module_db_url)
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http,
            Client(api.url, PRODUCER_TOKEN, retry_backoff=FAST) as client,
        ):
            t = Target(http, dispatcher.url, client, Leases())
            await t.refill()
            yield t
    finally:
        await dispatcher.close()
        await api.close()


# -- strategies --------------------------------------------------------------------------

# Any character, with the troublesome ones (U+0000 for PostgreSQL, JSON escapes, a line
# separator) about as likely as all others together.
characters = st.characters(codec="utf-8") | st.sampled_from(["\x00", "\\", '"', "\n", "\u2028"])


def texts(min_size: int = 0, max_size: int | None = None) -> st.SearchStrategy[str]:
    return st.lists(characters, min_size=min_size, max_size=max_size).map("".join)


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: past 64 bits too
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(texts(max_size=8), children, max_size=4)
    ),
    max_leaves=10,
)
nasty: st.SearchStrategy[Any] = st.sampled_from(
    [
        2**63,
        -(2**63) - 1,
        2**31,
        10**30,
        1e308,
        -1e308,
        -0.0,
        -1,
        0,
        86401,
        10**10,
        "\x00",
        "a\x00b",
        "\ud800",
        {"\x00": 1},
        "",
        "x" * 300,
        "00000000-0000-0000-0000-000000000000",
        "not-a-uuid",
        [],
        {},
        True,
        None,
    ]
)
odd = json_values | nasty
tokens = st.one_of(
    st.just(OWN_TOKEN),
    st.just(OWN_TOKEN),
    st.just(OWN_TOKEN),
    st.sampled_from([OTHER_TOKEN, SPENT_TOKEN]),
    st.uuids().map(str),
)
seconds = st.floats(0, 5) | st.integers(-5, 10**7) | odd
error_bodies = st.fixed_dictionaries(
    {"message": st.one_of(texts(max_size=50), texts(max_size=50), odd)},
    optional={
        "type": texts(max_size=20) | st.just("x" * 256) | odd,
        "retryable": st.booleans() | odd,
        "extra": json_values,
    },
)
results = json_values | nasty | st.just("x" * 2000)


def with_changes(
    base: st.SearchStrategy[dict[str, Any]], fields: list[str]
) -> st.SearchStrategy[dict[str, Any]]:
    """Well-formed documents, and the same with a field or two replaced or removed."""
    changes = st.dictionaries(st.sampled_from([*fields, "unknown"]), odd, max_size=2)
    dropped = st.sets(st.sampled_from(fields), max_size=1)

    def apply(doc: dict[str, Any], change: dict[str, Any], drop: set[str]) -> dict[str, Any]:
        out = {**doc, **change}
        for name in drop:
            out.pop(name, None)
        return out

    return st.one_of(base, base, st.builds(apply, base, changes, dropped))


def bodies(documents: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """Mostly `documents` as JSON (json.dumps writes what orjson would refuse: huge
    integers, lone surrogates), else any JSON, raw bytes, NaN/Infinity, or nothing."""
    wanted = documents.map(lambda d: json.dumps(d).encode())
    anything = (
        json_values.map(lambda v: json.dumps(v).encode())
        | st.binary(max_size=64)
        | st.sampled_from([b"", b"{", b"null", b'{"lease_token": NaN}', b"[1e999]", b"\x00"])
        | st.floats().map(lambda f: b'{"lease_token": "x", "result": ' + json.dumps(f).encode())
    )
    return st.one_of(wanted, wanted, wanted, anything)


# Never a wait that could hold the request: 0, a few hundredths, or something invalid.
waits: st.SearchStrategy[Any] = st.one_of(
    st.just(0),
    st.just(0),
    st.floats(0, 0.05),
    st.sampled_from([-1, 61, 10**9, 2**70, "0", None, True, [], 1e308]),
)
queue_names = st.sampled_from([QUEUE, QUEUE, "other"]) | st.from_regex(
    QUEUE_PATTERN, fullmatch=True
)
type_names = st.sampled_from([TYPE, TYPE, "t"]) | st.from_regex(TYPE_PATTERN, fullmatch=True)
claims = st.builds(
    lambda doc, wait: {**doc, "wait_seconds": wait},
    with_changes(
        st.fixed_dictionaries(
            {
                "worker_id": st.just("fuzz-worker") | texts(min_size=1, max_size=20),
                "queues": st.one_of(
                    st.lists(queue_names, min_size=1, max_size=3),
                    st.lists(queue_names, min_size=1, max_size=3),
                    st.lists(queue_names | odd, max_size=3),
                    st.lists(queue_names, min_size=21, max_size=22),
                ),
            },
            optional={
                "max_jobs": st.integers(1, 500) | odd,
                "types": st.lists(type_names, min_size=1, max_size=3)
                | st.lists(type_names | odd, max_size=3)
                | odd,
            },
        ),
        ["worker_id", "queues", "max_jobs", "types"],
    ),
    waits,
)
heartbeats = with_changes(
    st.fixed_dictionaries(
        {"lease_token": tokens},
        optional={"lease_seconds": st.integers(1, 86400) | seconds, "progress": odd},
    ),
    ["lease_token", "lease_seconds", "progress"],
)
completions = with_changes(
    st.fixed_dictionaries({"lease_token": tokens}, optional={"result": results}),
    ["lease_token", "result"],
)
failures = with_changes(
    st.fixed_dictionaries(
        {"lease_token": tokens, "error": error_bodies},
        optional={"retry_in_seconds": seconds},
    ),
    ["lease_token", "error", "retry_in_seconds"],
)
releases = with_changes(
    st.fixed_dictionaries({"lease_token": tokens}, optional={"delay_seconds": seconds}),
    ["lease_token", "delay_seconds"],
)
ack_items = with_changes(
    st.fixed_dictionaries(
        {
            "id": st.sampled_from([OWN_ID, KNOWN_ID]) | st.uuids().map(str),
            "lease_token": tokens,
            "outcome": st.sampled_from(["complete", "fail"]),
        },
        optional={"result": results, "error": error_bodies, "retry_in_seconds": seconds},
    ),
    ["id", "lease_token", "outcome", "result", "error"],
)
ack_batches = with_changes(
    st.fixed_dictionaries({"acks": st.lists(ack_items, min_size=1, max_size=5)}),
    ["acks"],
)
# Mostly a job with a live lease, so that bodies get as far as PostgreSQL.
path_ids = st.one_of(
    st.just(OWN_ID),
    st.just(OWN_ID),
    st.just(OWN_ID),
    st.just(OWN_ID),
    st.just(KNOWN_ID),
    st.uuids().map(str),
    texts(max_size=40).map(lambda s: quote(s, safe="")),
)

# -- sending and checking ----------------------------------------------------------------


async def send(
    target: Target,
    path: str,
    body: bytes,
    *,
    model: type[BaseModel],
) -> tuple[int, Any]:
    async with target.http.post(
        target.url + path,
        data=body,
        headers={**WORKER_HEADERS, "Content-Type": "application/json"},
    ) as response:
        status, text, content_type = response.status, await response.text(), response.content_type
    event(f"{path.rsplit('/', 1)[-1]}: {status}")  # see --hypothesis-show-statistics
    assert status < 500, f"POST {path}: {status} {text}\nbody: {body[:500]!r}"
    if status >= 400:
        assert content_type == PROBLEM_CONTENT_TYPE, (status, text)
        problem = json.loads(text)
        assert {"type", "title", "status", "detail", "code"} <= set(problem), problem
        assert problem["status"] == status
        assert isinstance(problem["code"], str) and problem["code"]
        if status == 422:
            assert problem["code"] == "validation_error" and problem["errors"], problem
        return status, problem
    assert status == 200, (status, text)
    model.model_validate_json(text)  # the answer has the documented shape
    return status, json.loads(text)


async def call_job_endpoint(
    target: Target,
    action: str,
    document: bytes | Any,
    path_id: Any,
    rng: random.Random,
    model: type[BaseModel],
) -> None:
    await target.refill()
    own = target.leases.take(rng)
    if not isinstance(document, bytes):
        document = json.dumps(target.resolve(document, own, rng)).encode()
    job_id = target.resolve(path_id, own, rng)
    status, _ = await send(target, f"/v1/jobs/{job_id}/{action}", document, model=model)
    if status == 200 and action != "heartbeat":
        target.leases.ended(str(job_id))


def raw_or(documents: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[Any]:
    """Documents still holding placeholders (resolved when sent), or finished bytes."""
    return st.one_of(documents, documents, documents, bodies(st.nothing()))


# -- tests -------------------------------------------------------------------------------


@FUZZ
@given(document=raw_or(claims))
async def test_claim(target: Target, document: Any) -> None:
    await target.refill()
    body = document if isinstance(document, bytes) else json.dumps(document).encode()
    status, answer = await send(target, "/v1/claim", body, model=ClaimResponse)
    if status == 200:
        target.leases.claimed(answer["jobs"])


@FUZZ
@given(document=raw_or(heartbeats), path_id=path_ids, seed=st.integers(0, 2**32))
async def test_heartbeat(target: Target, document: Any, path_id: Any, seed: int) -> None:
    await call_job_endpoint(
        target, "heartbeat", document, path_id, random.Random(seed), HeartbeatResponse
    )


@FUZZ
@given(document=raw_or(completions), path_id=path_ids, seed=st.integers(0, 2**32))
async def test_complete(target: Target, document: Any, path_id: Any, seed: int) -> None:
    await call_job_endpoint(target, "complete", document, path_id, random.Random(seed), JobModel)


@FUZZ
@given(document=raw_or(failures), path_id=path_ids, seed=st.integers(0, 2**32))
async def test_fail(target: Target, document: Any, path_id: Any, seed: int) -> None:
    await call_job_endpoint(target, "fail", document, path_id, random.Random(seed), JobModel)


@FUZZ
@given(document=raw_or(releases), path_id=path_ids, seed=st.integers(0, 2**32))
async def test_release(target: Target, document: Any, path_id: Any, seed: int) -> None:
    await call_job_endpoint(target, "release", document, path_id, random.Random(seed), JobModel)


@FUZZ
@given(document=raw_or(ack_batches), seed=st.integers(0, 2**32))
async def test_acks(target: Target, document: Any, seed: int) -> None:
    rng = random.Random(seed)
    await target.refill()
    if isinstance(document, bytes):
        body = document
    else:
        # Each item refers to a lease of its own (the same one, at times).
        items = document.get("acks")
        if isinstance(items, list):
            items = [target.resolve(item, target.leases.take(rng), rng) for item in items]
            document = {**document, "acks": items}
        body = json.dumps(target.resolve(document, target.leases.take(rng), rng)).encode()
    status, answer = await send(target, "/v1/acks", body, model=AcksResponse)
    if status == 200:
        for item in answer["results"]:
            if item["status"] == 200:
                target.leases.ended(str(item["id"]))
