"""Resolving a callback a job is suspended on (docs/callbacks.md, docs/http-api.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import Field

from evora.protocol.fields import LazyModel, Payload, WireModel


class ResolveCallbackRequest(WireModel):
    payload: Payload = Field(
        default=None, description="what the job's next attempt sees as `callback.payload`"
    )


class CallbackResolution(LazyModel):
    """A callback's resolution: the same for the first resolution and every repeat."""

    callback: UUID = Field(description="the callback's public id (the job's `callback.id`)")
    job_id: UUID
    resolved_at: datetime
    payload: Any
