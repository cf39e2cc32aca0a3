"""RFC 9457 problem details: the one shape of every error response (docs/http-api.md#errors)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from evora.http.jsonio import dumps
from evora.protocol import problems

PROBLEM_CONTENT_TYPE = "application/problem+json"


def problem_type(code: str) -> str:
    return f"urn:evora:problem:{code}"


class Problem(Exception):
    """An error answer raised from anywhere in a request; the middleware renders it."""

    def __init__(
        self,
        status: int,
        code: str,
        title: str,
        detail: str,
        *,
        errors: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.title = title
        self.detail = detail
        self.errors = errors
        self.headers = headers or {}

    def response(self) -> web.Response:
        body: dict[str, Any] = {
            "type": problem_type(self.code),
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "code": self.code,
        }
        if self.errors is not None:
            body["errors"] = self.errors
        response = web.Response(body=dumps(body), status=self.status, headers=self.headers)
        response.content_type = PROBLEM_CONTENT_TYPE
        return response


def validation_problem(errors: list[dict[str, Any]], detail: str | None = None) -> Problem:
    return Problem(
        422,
        problems.VALIDATION_ERROR,
        "Validation error",
        detail or "the request is not valid; see errors",
        errors=errors,
    )


def malformed_json(detail: str = "the body is not valid JSON") -> Problem:
    return Problem(400, problems.MALFORMED_JSON, "Malformed JSON", detail)


def payload_too_large(detail: str) -> Problem:
    return Problem(413, problems.PAYLOAD_TOO_LARGE, "Payload too large", detail)


def unavailable(detail: str, title: str = "Service unavailable") -> Problem:
    """A 503 the client may repeat shortly: the database or this process could not take the
    request now, and nothing of it was kept."""
    return Problem(503, problems.UNAVAILABLE, title, detail, headers={"Retry-After": "1"})


def unauthorized(detail: str) -> Problem:
    return Problem(
        401, problems.UNAUTHORIZED, "Unauthorized", detail, headers={"WWW-Authenticate": "Bearer"}
    )


def forbidden(detail: str) -> Problem:
    return Problem(403, problems.FORBIDDEN, "Forbidden", detail)


def request_timeout(detail: str) -> Problem:
    return Problem(408, "request_timeout", "Request timeout", detail)
