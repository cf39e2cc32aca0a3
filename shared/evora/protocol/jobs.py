"""The job on the wire: what a producer submits (docs/http-api.md#submitting-a-job), the job
and event resources the services answer with, and the admin API's bodies and pages.

Request models validate at the edge; response models are not used to serialise (the
services' dicts go straight to orjson): they describe the answers in /openapi.json, and the
tests check real answers against them.
"""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import ConfigDict, Field, field_validator, model_validator

from evora.protocol.bounds import (
    DEFAULT_BACKOFF_INITIAL_SECONDS,
    DEFAULT_BACKOFF_MAX_SECONDS,
    DEFAULT_BACKOFF_MULTIPLIER,
    DEPENDENCY_REF_PREFIX,
    LIMIT_KEY_PATTERN,
    MAX_BATCH,
    MAX_DEPENDENCIES,
    MAX_LIMIT_KEYS,
    MAX_SECONDS,
    REF_PATTERN,
)
from evora.protocol.fields import (
    Key,
    LazyModel,
    Payload,
    QueueName,
    Timestamp,
    TypeName,
    WholeNumber,
    WireModel,
)
from evora.protocol.states import JobState

MAX_REDRIVE = 1_000_000

# "ref:<name>": the item of the same batch that carries "ref": "<name>", earlier in the list.
DependencyRef = Annotated[
    str,
    Field(
        pattern="^" + DEPENDENCY_REF_PREFIX + REF_PATTERN[1:],
        description="an earlier item of the same batch, by its ref",
    ),
]
OnDependencyFailure = Literal["cancel", "run"]
LimitKey = Annotated[str, Field(pattern=LIMIT_KEY_PATTERN)]


class Backoff(WireModel):
    # JSON Schema cannot compare two fields, so /openapi.json says this rule in words.
    # Frozen: a value, so every submission without one can share the default below.
    model_config = ConfigDict(
        frozen=True,
        json_schema_extra={
            "description": "max_seconds must be >= initial_seconds (a field left out counts "
            "with its default), else 422."
        },
    )

    initial_seconds: float = Field(default=DEFAULT_BACKOFF_INITIAL_SECONDS, gt=0, le=MAX_SECONDS)
    max_seconds: float = Field(default=DEFAULT_BACKOFF_MAX_SECONDS, gt=0, le=MAX_SECONDS)
    multiplier: float = Field(default=DEFAULT_BACKOFF_MULTIPLIER, ge=1, le=1000)

    @model_validator(mode="after")
    def _max_not_below_initial(self) -> Backoff:
        if self.max_seconds < self.initial_seconds:
            raise ValueError("max_seconds must be >= initial_seconds")
        return self


class Debounce(WireModel):
    """docs/flow-control.md, "Debounce and throttle"."""

    model_config = ConfigDict(
        frozen=True,
        json_schema_extra={"description": "max_delay_seconds must be >= delay_seconds, else 422."},
    )

    key: Key = Field(description="the PENDING job of this key in the queue absorbs the submission")
    delay_seconds: float = Field(
        ge=0, le=MAX_SECONDS, description="the job runs this long after the last submission"
    )
    max_delay_seconds: float = Field(
        gt=0,
        le=MAX_SECONDS,
        description="but never later than this long after the submission that made it",
    )

    @model_validator(mode="after")
    def _max_not_below_delay(self) -> Debounce:
        if self.max_delay_seconds < self.delay_seconds:
            raise ValueError("max_delay_seconds must be >= delay_seconds")
        return self


class Throttle(WireModel):
    """docs/flow-control.md, "Debounce and throttle"."""

    model_config = ConfigDict(frozen=True)

    key: Key
    window_seconds: float = Field(
        gt=0,
        le=MAX_SECONDS,
        description="a submission this soon after the job the key last admitted answers that job",
    )


# Shared by every submission that names no backoff: building a model for each item was
# about a quarter of validating it (a 1,000-job batch, best of 30 runs: 4.4 us per item
# with a model built for each, 3.0-3.3 us with this one). Made on the first such
# submission, not at import, which would build Backoff's validator in every process.
@cache
def _default_backoff() -> Backoff:
    return Backoff()


class JobSubmission(WireModel):
    # The schedule rule of _consistent for /openapi.json: run_at and delay_seconds, both given
    # and not null.
    model_config = ConfigDict(
        json_schema_extra={
            "not": {
                "required": ["run_at", "delay_seconds"],
                "properties": {"run_at": {"type": "string"}, "delay_seconds": {"type": "number"}},
            }
        }
    )

    queue: QueueName
    type: TypeName
    payload: Payload = Field(default_factory=dict)
    priority: WholeNumber = Field(default=0, ge=-32768, le=32767)
    run_at: Timestamp | None = None
    delay_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    max_attempts: WholeNumber = Field(default=5, ge=1, le=1000)
    lease_seconds: WholeNumber = Field(default=30, ge=1, le=86400)
    max_duration_seconds: WholeNumber | None = Field(
        default=None,
        ge=1,
        le=MAX_SECONDS,
        description="the hard time limit of an attempt, however often it heartbeats: past it "
        "the worker is asked to stop, and after a grace of lease_seconds the attempt fails "
        "with reason timeout (docs/jobs-that-wait.md)",
    )
    backoff: Backoff = Field(default_factory=_default_backoff)
    expires_at: Timestamp | None = None
    idempotency_key: Key | None = None
    group_key: Key | None = None
    depends_on: list[UUID | DependencyRef] = Field(
        default_factory=list,
        max_length=MAX_DEPENDENCIES,
        description="jobs that must finish first; until then this job is WAITING",
    )
    on_dependency_failure: OnDependencyFailure = Field(
        default="cancel",
        description='a dependency ended CANCELLED: "cancel" this job too, or "run" it anyway',
    )
    ref: str | None = Field(
        default=None,
        pattern=REF_PATTERN,
        description='a name later items of the same batch depend on as "ref:<name>"',
    )
    limit_keys: list[LimitKey] = Field(
        default_factory=list,
        max_length=MAX_LIMIT_KEYS,
        description="the concurrency and rate limits this job counts against, besides its "
        "queue's (docs/flow-control.md); the first is its round-robin lane",
    )
    fairness_key: LimitKey | None = Field(
        default=None,
        description="the tenant this job is served as: a queue's claims share its workers "
        "among its fairness keys by weight and by the lease time their jobs hold "
        "(docs/flow-control.md, Fairness keys)",
    )
    debounce: Debounce | None = Field(
        default=None,
        description="the PENDING job of this key absorbs the submission (payload replaced, run "
        'time pushed back): 200 with `"debounced": true`',
    )
    throttle: Throttle | None = Field(
        default=None,
        description="within the window of this key's last job, answers that job (200, "
        '`"throttled": true`) and stores nothing',
    )

    # One validator for the rules between fields: each is a call into Python per item of a
    # batch, and the call costs more than the checks.
    @model_validator(mode="after")
    def _consistent(self) -> JobSubmission:
        if self.run_at is not None and self.delay_seconds is not None:
            raise ValueError("give run_at or delay_seconds, not both")
        if self.depends_on and len(set(self.depends_on)) != len(self.depends_on):
            raise ValueError("depends_on names a job more than once")
        if self.debounce is not None or self.throttle is not None:
            self._keyed_consistent()
        return self

    def _keyed_consistent(self) -> None:
        """The rules of a debounce or throttle key (evora.validated has the same): it may
        answer with an existing job, so the item has no job of its own to name or key."""
        kind = "debounce" if self.debounce is not None else "throttle"
        if self.debounce is not None and self.throttle is not None:
            raise ValueError("give debounce or throttle, not both")
        if self.debounce is not None and (
            self.run_at is not None or self.delay_seconds is not None
        ):
            raise ValueError("debounce sets the run time itself: give no run_at or delay_seconds")
        if self.idempotency_key is not None:
            raise ValueError(f"idempotency_key cannot be combined with {kind}")
        if self.depends_on or self.ref is not None:
            raise ValueError(f"{kind} cannot be combined with depends_on or ref")

    @field_validator("limit_keys")
    @classmethod
    def _limit_keys_once(cls, keys: list[str]) -> list[str]:
        if len(set(keys)) != len(keys):
            raise ValueError("names a key more than once")
        return keys


class BatchSubmission(WireModel):
    jobs: list[JobSubmission] = Field(min_length=1, max_length=MAX_BATCH)


class RedriveRequest(WireModel):
    type: TypeName | None = Field(default=None, description="only DLQ jobs of this type")
    limit: int | None = Field(
        default=None, ge=1, le=MAX_REDRIVE, description="move at most this many jobs"
    )


# -- responses -----------------------------------------------------------------------------


class LastError(LazyModel):
    message: str
    type: str | None = None
    traceback: str | None = None


class Callback(LazyModel):
    """The callback a job is suspended on, or was last (docs/callbacks.md). Its `id` names
    it; the credential that resolves it was handed to the suspending worker only."""

    id: UUID
    on_timeout: Literal["fail", "dlq", "resume"]
    suspended_at: datetime
    timeout_at: datetime
    resolved_at: datetime | None = Field(description="null while it waits, or if it timed out")
    timed_out: bool
    payload: Any = Field(description="what the resolution carried (null until then)")


class Job(LazyModel):
    """A job as the API returns it (docs/http-api.md#the-job-resource)."""

    id: UUID
    queue: str
    type: str
    payload: Any
    state: JobState
    priority: int
    group_key: str | None
    idempotency_key: str | None
    attempt: int
    snoozes: int = Field(
        description="times a worker snoozed it (docs/jobs-that-wait.md): not counted in attempt"
    )
    max_attempts: int
    lease_seconds: int
    max_duration_seconds: int | None = Field(
        description="the hard time limit of an attempt (docs/jobs-that-wait.md); null: none"
    )
    run_at: datetime
    expires_at: datetime | None
    lease_expires_at: datetime | None
    worker_id: str | None
    cancel_requested: bool
    result: Any
    last_error: LastError | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    depends_on: list[UUID] = Field(description="the jobs this one waits for (or waited for)")
    limit_keys: list[str] = Field(description="the limit keys it holds besides its queue's")
    checkpoints: dict[str, Any] | None = Field(
        description="the steps its handler recorded, name -> data (docs/jobs-that-wait.md); "
        "null: none"
    )
    fairness_key: str | None = Field(
        default=None, description="the fairness key (tenant) it is served as; null: none"
    )
    callback: Callback | None = Field(
        default=None,
        description=(
            "the callback it is SUSPENDED on, or the last one it was: what an attempt after it "
            "was resolved or timed out sees (docs/callbacks.md); null if it never suspended"
        ),
    )


class ClaimedJob(Job):
    lease_token: UUID
    dependency_results: dict[str, Any] | None = Field(
        default=None,
        description=(
            "{job id: result} of its COMPLETED dependencies; only for a job with dependencies"
        ),
    )
    traceparent: str | None = Field(
        default=None,
        description=(
            "the W3C trace context the job was submitted with; only from a dispatcher that "
            "traces, and absent when the job has none"
        ),
    )


class JobResponse(Job):
    """The job resource, with the extra fields the API also returns."""

    backoff: Backoff
    progress: Any = Field(default=None, description="the last progress a worker reported")
    debounced: bool | None = Field(
        default=None,
        description="present (true) when a debounce key's job absorbed the submission",
    )
    throttled: bool | None = Field(
        default=None,
        description="present (true) when a throttle key answered the submission with its job",
    )


class JobEvent(LazyModel):
    """One row of the `job_events` outbox (docs/http-api.md#the-event-resource)."""

    seq: int
    job_id: UUID
    queue: str
    type: str
    event: str
    from_state: JobState | None
    to_state: JobState
    attempt: int
    worker_id: str | None
    at: datetime
    data: dict[str, Any]


class Dependents(LazyModel):
    jobs: list[JobResponse] = Field(description="the jobs that depend on this one")


class BatchItem(LazyModel):
    status: Literal[200, 201] = Field(description="201 created, 200 idempotent replay")
    job: JobResponse


class BatchResult(LazyModel):
    jobs: list[BatchItem]


class JobList(LazyModel):
    jobs: list[JobResponse]
    next: str | None = Field(description="pass as `after` for the next page; null at the end")


class Events(LazyModel):
    events: list[JobEvent]


class Redriven(LazyModel):
    redriven: int


class QueuePauseState(LazyModel):
    queue: str
    paused: bool
