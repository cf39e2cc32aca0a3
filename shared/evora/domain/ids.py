"""Job ids as request paths name them."""

from __future__ import annotations

from uuid import UUID

from evora.domain.errors import JobNotFound


def job_id(text: str) -> UUID:
    """The job a path's `{id}` names. Something that is not a UUID names no job, so it is
    the same 404 as an unknown id rather than a validation error."""
    try:
        return UUID(text)
    except ValueError:
        raise JobNotFound(f"job {text!r} not found") from None
