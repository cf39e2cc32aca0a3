"""Path parameters, checked at the edge like bodies are (rule 10 of docs/architecture.md)."""

from __future__ import annotations

from uuid import UUID

from aiohttp import web
from pydantic import TypeAdapter, ValidationError

from evora.domain.errors import JobNotFound
from evora.domain.models import QueueName
from evora.http.problems import validation_problem

_QUEUE_NAME: TypeAdapter[str] = TypeAdapter(QueueName)


def job_id(request: web.Request) -> UUID:
    """The `{id}` of the path. Something that is not a UUID names no job, so it is the same
    404 as an unknown id rather than a validation error."""
    try:
        return UUID(request.match_info["id"])
    except ValueError:
        raise JobNotFound("no job has that id") from None


def queue_name(request: web.Request) -> str:
    """The `{queue}` of the path; a name no submission could use is a 422."""
    try:
        return _QUEUE_NAME.validate_python(request.match_info["queue"])
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False, include_context=False)
        raise validation_problem(
            [{"loc": ["path", "queue"], "msg": e["msg"], "type": e["type"]} for e in errors]
        ) from None
