"""Every operation of a live service's /openapi.json, driven by schemathesis.

For each operation, Hypothesis generates requests from the document: valid ones
(POSITIVE) and, where the operation takes parameters or a body, ones that break the
document (NEGATIVE). Each answer is checked: no 5xx, a status the document declares for
the operation, its declared content type, a body that matches the declared schema, and a
4xx for every request that breaks the document. (Not checked: that every request the
document allows is accepted. JSON Schema cannot say all the servers' rules, e.g. a backoff
whose max_seconds is below its initial_seconds, or 100.0 for an integer; the documents
say those in words.)

Generation is derandomized (Hypothesis makes the same choices on every run, for this
schemathesis and Hypothesis version; the answers, and so what schemathesis does next,
may still vary with the database) and nothing is kept between runs. A failure is reported
with the operation, the mode and a curl command that sends the failing request again;
`pytest tests/fuzz -s` prints what was sent, the statuses answered and where the time went.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, given, note, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Err
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.fuzz.conftest import Seeded

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    # a request that breaks the document is refused: the document is not looser than
    # the server
    negative_data_rejection,
]

# Every request carries a valid token (passed to `fuzz`); a generated Authorization header
# would only test auth, and a "missing token" negative case would be made valid by it.
# Explicit, so that no schemathesis.toml around changes what is generated.
CONFIG = schemathesis.Config.from_dict({"generation": {"with-security-parameters": False}})

# Edits a generated request before it is sent. It must not change whether the request
# is valid, or the negative_data_rejection check would judge a different request.
Prepare = Callable[[schemathesis.Case[Any]], None]


class _Curl:
    """A curl command for `note`, built only when Hypothesis reports the note (the failing
    example's replay): building one for every generated case was 3.5 % of the fuzzer's samples."""

    def __init__(self, case: schemathesis.Case[Any], headers: dict[str, str]) -> None:
        self.case = case
        self.headers = headers

    def __repr__(self) -> str:
        return self.case.as_curl_command(headers=self.headers)


@dataclass
class Report:
    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))

    def summary(self, service: str) -> str:
        """What was sent and answered, and where the time went (pytest -s shows it)."""
        times = ", ".join(
            f"{k} {v:.1f}s" for k, v in sorted(self.seconds.items(), key=lambda kv: -kv[1])
        )
        return (
            f"{service}: {self.requests} requests, statuses {dict(sorted(self.statuses.items()))}"
            f"; {times}"
        )


def fuzz(base_url: str, headers: dict[str, str], *, examples: int, prepare: Prepare) -> Report:
    """`examples` requests per operation and mode; `prepare` may edit each before it is
    sent (e.g. to name real jobs). An operation whose every request has been sent stops
    early (one request for one without parameters)."""
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json", config=CONFIG)
    report = Report()
    # One keep-alive connection for all requests: without a session each request paid a
    # connect, an accept and a teardown (urllib3's create_connection alone was 2.4 % of the
    # profiled samples). No service sets cookies, so the session carries nothing from one
    # request to the next.
    with requests.Session() as session:
        for result in schema.get_all_operations():
            if isinstance(result, Err):
                raise result.err()
            operation = result.ok()
            negatable = bool(operation.path_parameters or operation.query or operation.body)
            modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if negatable else [])
            for mode in modes:

                @settings(
                    max_examples=examples,
                    deadline=None,
                    derandomize=True,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                )
                @given(case=operation.as_strategy(generation_mode=mode))
                def run(case: schemathesis.Case[Any]) -> None:
                    prepare(case)
                    note(_Curl(case, headers))
                    sent = time.perf_counter()
                    response = case.call(base_url=base_url, session=session, headers=headers)
                    report.seconds["(waiting for answers)"] += time.perf_counter() - sent
                    report.requests += 1
                    report.statuses[response.status_code] += 1
                    case.validate_response(response, checks=CHECKS, headers=headers)

                started = time.perf_counter()
                try:
                    run()
                except Unsatisfiable:
                    # A path parameter that is any non-empty string has no wrong value that
                    # still reaches the operation.
                    if mode is not GenerationMode.NEGATIVE:
                        raise
                except (Exception, BaseExceptionGroup) as exc:
                    report.failures.append(f"{operation.label} ({mode.value}):\n{exc}")
                report.seconds[operation.label] += time.perf_counter() - started
    return report


# -- naming real jobs ---------------------------------------------------------------------


def _pick(value: object) -> int | None:
    """For about half the generated job ids, an index that picks a real job instead; the
    choice follows the generated value, so it is as deterministic as the generation."""
    try:
        number = uuid.UUID(str(value)).int
    except ValueError:
        return None
    return number >> 1 if number % 2 == 0 else None


def real_jobs(seeded: Seeded) -> Prepare:
    """Replace generated job ids (and their lease tokens) with seeded ones: a path `id`
    with any seeded job, or, where the body carries a lease token, with a RUNNING job and
    its current token; the same for each item of an acks body. Only in valid requests: in
    the others the id or token may be what was made wrong."""

    def lease(index: int) -> tuple[str, str]:
        return seeded.leases[index % len(seeded.leases)]

    def prepare(case: schemathesis.Case[Any]) -> None:
        if case.meta is None or case.meta.generation.mode is not GenerationMode.POSITIVE:
            return
        body = case.body
        params = case.path_parameters or {}
        if "id" in params and (index := _pick(params["id"])) is not None:
            if isinstance(body, dict) and "lease_token" in body:
                params["id"], body["lease_token"] = lease(index)
            else:
                params["id"] = seeded.ids[index % len(seeded.ids)]
        acks = body.get("acks") if isinstance(body, dict) else None
        for ack in acks if isinstance(acks, list) else []:
            if isinstance(ack, dict) and (index := _pick(ack.get("id"))) is not None:
                ack["id"], ack["lease_token"] = lease(index)

    return prepare
