"""Error answers become typed exceptions: by problem `code` first, HTTP status second."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

import evora
from evora.sdk.errors import error_from_response


def problem(status: int, code: str, **extra: Any) -> bytes:
    body = {"type": "about:blank", "title": "T", "status": status, "detail": "D", "code": code}
    return orjson.dumps({**body, **extra})


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (404, "job_not_found", evora.JobNotFoundError),
        (404, "queue_not_found", evora.QueueNotFoundError),
        (409, "lease_lost", evora.LeaseLostError),
        (409, "invalid_state", evora.InvalidStateError),
        (409, "idempotency_conflict", evora.IdempotencyConflictError),
        (409, "idempotent_job_gone", evora.IdempotentJobGoneError),
        (422, "validation_error", evora.RequestValidationError),
        (401, "unauthorized", evora.UnauthorizedError),
        (403, "forbidden", evora.ForbiddenError),
        (413, "payload_too_large", evora.PayloadTooLargeError),
        (429, "queue_full", evora.QueueFullError),
        (400, "malformed_json", evora.MalformedJSONError),
    ],
)
def test_known_codes_map_to_their_class(status: int, code: str, cls: type[Exception]) -> None:
    error = error_from_response(status, problem(status, code))
    assert type(error) is cls
    assert (error.status, error.code, error.title, error.detail) == (status, code, "T", "D")
    assert isinstance(error, evora.EvoraHTTPError) and isinstance(error, evora.EvoraClientError)


def test_code_specific_classes_are_caught_by_their_status_class() -> None:
    assert isinstance(error_from_response(409, problem(409, "lease_lost")), evora.ConflictError)
    assert isinstance(error_from_response(404, problem(404, "job_not_found")), evora.NotFoundError)
    assert isinstance(
        error_from_response(400, problem(400, "malformed_json")), evora.BadRequestError
    )


def test_validation_errors_are_kept() -> None:
    errors = [{"loc": ["body", "jobs", 3, "queue"], "msg": "Field required"}]
    error = error_from_response(422, problem(422, "validation_error", errors=errors))
    assert isinstance(error, evora.RequestValidationError)
    assert error.errors == errors and error.body["errors"] == errors


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (401, evora.UnauthorizedError),
        (403, evora.ForbiddenError),
        (404, evora.NotFoundError),
        (409, evora.ConflictError),
        (413, evora.PayloadTooLargeError),
        (422, evora.RequestValidationError),
        (400, evora.BadRequestError),
        (503, evora.ServerError),
        (500, evora.ServerError),
        (418, evora.EvoraHTTPError),
    ],
)
def test_unknown_codes_fall_back_to_the_status(status: int, cls: type[Exception]) -> None:
    assert type(error_from_response(status, problem(status, "something_new"))) is cls


def test_a_body_that_is_not_a_problem_still_gives_a_useful_error() -> None:
    error = error_from_response(502, b"<html>Bad Gateway</html>", reason="Bad Gateway")
    assert isinstance(error, evora.ServerError)
    assert (error.status, error.code, error.title) == (502, "http_502", "Bad Gateway")
    assert error.detail == "<html>Bad Gateway</html>" and error.body is None
    empty = error_from_response(401, b"")
    assert isinstance(empty, evora.UnauthorizedError) and empty.code == "unauthorized"


def test_message_names_status_code_and_detail() -> None:
    assert str(error_from_response(404, problem(404, "job_not_found"))) == "404 job_not_found: D"
