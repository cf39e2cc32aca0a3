"""Path parameters, checked at the edge like bodies are (rule 10 of docs/architecture.md)."""

from __future__ import annotations

from uuid import UUID

from aiohttp import web
from pydantic import TypeAdapter, ValidationError

from evora.domain import ids
from evora.http.problems import validation_problem
from evora.protocol.fields import QueueName

_QUEUE_NAME: TypeAdapter[str] = TypeAdapter(QueueName)


def job_id(request: web.Request) -> UUID:
    """The job the `{id}` of the path names (a 404 if it cannot name one)."""
    return ids.job_id(request.match_info["id"])


def queue_name(request: web.Request) -> str:
    """The `{queue}` of the path; a name no submission could use is a 422."""
    try:
        return _QUEUE_NAME.validate_python(request.match_info["queue"])
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False, include_context=False)
        raise validation_problem(
            [{"loc": ["path", "queue"], "msg": e["msg"], "type": e["type"]} for e in errors]
        ) from None
