"""Whatever a client sends, the api answers below 500, and every error is problem+json
(docs/http-api.md#errors; rule 10 of docs/architecture.md).

Generated bodies range from well-formed submissions with odd values (which get through
validation to PostgreSQL) to arbitrary JSON and raw bytes; paths and query strings get
arbitrary text. Every request uses the admin token, which may call every endpoint, so each
one reaches its handler.
"""

from __future__ import annotations

import json
from datetime import timedelta, timezone
from typing import Any
from urllib.parse import quote

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from evora.http.problems import PROBLEM_CONTENT_TYPE
from evora.protocol.bounds import QUEUE_PATTERN, TYPE_PATTERN
from evora.protocol.jobs import BatchResult, JobList, JobResponse, QueuePauseState, Redriven
from tests.api.conftest import ADMIN, ApiClient

FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,  # a failure prints how to reproduce it with @reproduce_failure
)

# -- strategies ----------------------------------------------------------------------------

# Any character, with the ones that are special somewhere (U+0000 in PostgreSQL, escapes
# in JSON, line separators) about as likely as all others together. Joined from a list
# because st.text() folds an alphabet's branches together and so keeps them rare.
characters = st.characters(codec="utf-8") | st.sampled_from(["\x00", "\\", '"', "\n", "\u2028"])


def texts(min_size: int = 0, max_size: int | None = None) -> st.SearchStrategy[str]:
    return st.lists(characters, min_size=min_size, max_size=max_size).map("".join)


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: beyond 64 bits too
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts()
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(texts(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
# Values known to trip a layer somewhere: 64-bit and PostgreSQL ranges, U+0000 (which
# PostgreSQL text and jsonb cannot hold), timestamps that overflow once moved to UTC.
nasty = st.sampled_from(
    [
        2**63,
        -(2**63) - 1,
        10**30,
        1e308,
        -0.0,
        "\x00",
        "a\x00b",
        "\ud800",
        {"\x00": 1},
        ["\\u0000"],
        "",
        "x" * 256,
        32768,
        -32769,
        1001,
        86401,
        10**10,
        "0001-01-01T00:00:00+01:00",
        "9999-12-31T23:59:59-01:00",
        "9999-12-31T23:59:59Z",
        "0000-01-01T00:00:00Z",
        "2030-02-30T00:00:00Z",
        "2030-01-01T00:00:00+24:00",
        "2030-01-01T00:00:00",
    ]
)
odd_values = json_values | nasty
offsets = st.builds(
    timezone, st.timedeltas(min_value=timedelta(hours=-23), max_value=timedelta(hours=23))
)
timestamps = st.datetimes(timezones=offsets).map(lambda d: d.isoformat())
keys = texts(min_size=1, max_size=8)
# Submissions that pass validation, so that what lies behind it (the store, PostgreSQL,
# serialising the answer) is exercised too.
valid_fields: dict[str, st.SearchStrategy[Any]] = {
    "payload": json_values,
    "priority": st.integers(-32768, 32767),
    "run_at": timestamps,
    "max_attempts": st.integers(1, 1000),
    "lease_seconds": st.integers(1, 86400),
    "backoff": st.fixed_dictionaries(
        {}, optional={"initial_seconds": st.floats(0.001, 10), "multiplier": st.just(1.5)}
    ),
    "expires_at": timestamps,
    "idempotency_key": keys,
    "group_key": keys,
}
valid_submissions = st.fixed_dictionaries(
    {
        "queue": st.from_regex(QUEUE_PATTERN, fullmatch=True),
        "type": st.from_regex(TYPE_PATTERN, fullmatch=True),
    },
    optional=valid_fields,
)
changed_fields = [*valid_fields, "queue", "type", "delay_seconds", "unknown"]
# ...and the same with a field or two replaced by something odd.
submissions = st.builds(
    lambda valid, changes: {**valid, **changes},
    valid_submissions,
    st.dictionaries(st.sampled_from(changed_fields), odd_values | timestamps, max_size=2),
)


def encoded(values: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    # json.dumps, not orjson: it writes what orjson refuses (huge integers, NaN, lone
    # surrogates as escapes), which a real client may well send.
    return values.map(lambda v: json.dumps(v).encode())


def bodies(documents: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """Mostly `documents`, else any JSON, raw bytes, or a NaN or Infinity."""
    wanted = encoded(documents)
    anything = (
        encoded(json_values)
        | st.binary(max_size=64)
        | encoded(st.floats()).map(lambda b: b'{"payload": ' + b + b"}")
    )
    return st.one_of(wanted, wanted, anything)


JOB_ROUTES = [
    ("GET", ""),
    ("GET", "/events"),
    ("POST", "/cancel"),
    ("POST", "/retry"),
    ("POST", "/discard"),
]
path_segments = texts(max_size=40).map(lambda s: quote(s, safe=""))
query_values = texts(max_size=20)
list_queries = st.dictionaries(
    # Mostly known names: one unknown parameter already makes the whole query a 422.
    st.sampled_from(["queue", "state", "type", "limit", "after", "x"]),
    st.sampled_from(["PENDING", "DLQ", "1", "500", "0", "-1", "AAAAAAAAAAE"]) | query_values,
    max_size=5,
)

# -- checks --------------------------------------------------------------------------------


async def check(
    client: ApiClient,
    method: str,
    path: str,
    *,
    data: bytes | None = None,
    params: dict[str, str] | None = None,
    model: type[BaseModel] | None = None,
) -> None:
    response = await client.request(method, path, data=data, params=params, headers=ADMIN)
    text = await response.text()
    event(f"status {response.status}")  # see --hypothesis-show-statistics
    assert response.status < 500, f"{method} {path}: {response.status} {text}"
    if response.status >= 400:
        assert response.content_type == PROBLEM_CONTENT_TYPE, text
        body = json.loads(text)
        assert {"type", "title", "status", "detail", "code"} <= set(body)
    elif model is not None:
        model.model_validate_json(text)  # the answer is what /openapi.json says it is


# -- tests ---------------------------------------------------------------------------------


@FUZZ
@given(body=bodies(submissions))
async def test_submit(shared_client: ApiClient, body: bytes) -> None:
    await check(shared_client, "POST", "/v1/jobs", data=body, model=JobResponse)


@FUZZ
@given(
    body=bodies(st.fixed_dictionaries({"jobs": st.lists(submissions, max_size=4)}))
    | encoded(st.fixed_dictionaries({"jobs": json_values}))
)
async def test_submit_batch(shared_client: ApiClient, body: bytes) -> None:
    await check(shared_client, "POST", "/v1/jobs/batch", data=body, model=BatchResult)


@FUZZ
@given(
    segment=path_segments,
    route=st.sampled_from(JOB_ROUTES),
    body=st.none() | st.binary(max_size=16),
)
async def test_job_routes(
    shared_client: ApiClient, segment: str, route: tuple[str, str], body: bytes | None
) -> None:
    method, suffix = route
    await check(shared_client, method, f"/v1/jobs/{segment}{suffix}", data=body)


@FUZZ
@given(params=list_queries)
async def test_list(shared_client: ApiClient, params: dict[str, str]) -> None:
    await check(shared_client, "GET", "/v1/jobs", params=params, model=JobList)


queue_segments = st.from_regex(QUEUE_PATTERN, fullmatch=True) | texts(max_size=10)
redrive_bodies = st.fixed_dictionaries(
    {},
    optional={
        "type": st.from_regex(TYPE_PATTERN, fullmatch=True) | odd_values,
        "limit": st.integers(1, 10) | odd_values,
    },
)


@FUZZ
@given(
    queue=queue_segments.map(lambda s: quote(s, safe="")),
    action=st.sampled_from(["pause", "resume", "redrive"]),
    body=bodies(redrive_bodies) | st.just(b""),
)
async def test_queue_routes(shared_client: ApiClient, queue: str, action: str, body: bytes) -> None:
    model = Redriven if action == "redrive" else QueuePauseState
    await check(shared_client, "POST", f"/v1/queues/{queue}/{action}", data=body, model=model)
