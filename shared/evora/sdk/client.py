"""`evora.Client`: the async producer and admin client of the api service (docs/http-api.md).

Retry safety, call by call. Any call is sent again (up to `retries` times) when the
connection could not be established, since the server never saw it. After a broken
connection, a timeout or a 502/503/504, the server may have acted, so a call is repeated
only when repeating it cannot do anything twice:

- `get`, `events`, `list_jobs`, `queues`, `stats`, `workers`: repeated (reads).
- `submit` with an idempotency key, `submit_batch` when every item has one: repeated; the
  server deduplicates and answers a repeat with 200 + the same job, so a result may say
  `replayed` about a job this very call created.
- `submit`, `submit_batch` without keys: not repeated; a repeat could create a second job.
- `cancel`, `discard`: repeated. Both drive the job towards CANCELLED, which is final, so a
  repeat cannot undo or redo anything; when a repeat finds the job already CANCELLED (the
  first attempt worked but its answer was lost), the job is returned instead of raising
  `InvalidStateError`.
- `pause`, `resume`: repeated; they set a flag.
- `retry`, `redrive`: not repeated. Between two attempts the job can fail again and be back
  in the DLQ, and the repeat would grant it a second fresh attempt budget.
- `put_schedule`, `pause_schedule`, `resume_schedule`, `schedule`, `schedules`: repeated (a
  PUT replaces with the same definition; the others set a flag or read).
- `delete_schedule`: repeated; a repeat that finds the schedule gone (the first attempt
  worked) returns instead of raising `ScheduleNotFoundError`.
- `trigger_schedule`: not repeated; a repeat would make a second job.
- `set_limit`, `limit`, `limits`, `room`: repeated (a PUT replaces with the same limit; reads).
- `delete_limit`: repeated; a repeat that finds the limit gone (the first attempt worked)
  returns instead of raising `LimitNotFoundError`.
- `set_fairness`, `fairness`, `delete_fairness`: repeated (a PUT sets the same weight, a
  DELETE answers 204 whether or not there was one; a read).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Final, Literal, Required, Self, TypedDict, Unpack, overload
from urllib.parse import quote
from uuid import UUID

from evora.protocol.bounds import MAX_PAGE
from evora.protocol.retries import RetryBackoff
from evora.protocol.states import JobState
from evora.sdk._http import NO_BODY, Response, Transport
from evora.sdk.errors import (
    EvoraClientError,
    InvalidStateError,
    LimitNotFoundError,
    ScheduleNotFoundError,
)
from evora.sdk.tracing import context_headers

# Queue stats per page when listing every queue: the most the api serves at once.

JobData = dict[str, Any]
"""A job resource exactly as the API returns it (docs/http-api.md#the-job-resource)."""


class BackoffSpec(TypedDict, total=False):
    initial_seconds: float
    max_seconds: float
    multiplier: float


class DebounceSpec(TypedDict):
    """The PENDING job of `key` in the queue absorbs the submission (docs/flow-control.md,
    "Debounce and throttle"): payload replaced, run `delay_seconds` after it, never later
    than `max_delay_seconds` after the submission that made the job."""

    key: str
    delay_seconds: float
    max_delay_seconds: float


class ThrottleSpec(TypedDict):
    """Within `window_seconds` of the job `key` last admitted, that job answers and nothing
    is stored (docs/flow-control.md, "Debounce and throttle")."""

    key: str
    window_seconds: float


class SubmitOptions(TypedDict, total=False):
    """The optional submission fields (docs/http-api.md#submitting-a-job); omitted ones take
    the server's defaults."""

    priority: int
    run_at: datetime | str
    delay_seconds: float
    max_attempts: int
    lease_seconds: int
    max_duration_seconds: int
    """The hard time limit of an attempt, however often it heartbeats (docs/jobs-that-wait.md):
    past it the worker is asked to stop, and after a grace of `lease_seconds` the attempt
    fails with error type `timeout`."""
    backoff: BackoffSpec
    expires_at: datetime | str
    idempotency_key: str
    group_key: str
    depends_on: Sequence[str | UUID]
    """Jobs that must finish first (docs/dependencies.md); in a batch also "ref:<name>"."""
    on_dependency_failure: Literal["cancel", "run"]
    limit_keys: Sequence[str]
    """The concurrency and rate limits the job counts against (docs/flow-control.md)."""
    fairness_key: str
    """The tenant the job is served as: a queue's workers are shared among its fairness keys
    by weight and by the lease time their jobs hold (docs/flow-control.md)."""
    debounce: DebounceSpec
    """Not with throttle, run_at, delay_seconds, idempotency_key, depends_on or ref."""
    throttle: ThrottleSpec
    """Not with idempotency_key, depends_on or ref."""


class Submission(SubmitOptions, total=False):
    """One item of `Client.submit_batch`: the wire shape of `POST /v1/jobs`."""

    queue: Required[str]
    type: Required[str]
    payload: Any
    ref: str
    """The name later items of the same batch depend on as "ref:<name>"."""


@dataclass(frozen=True)
class SubmitResult:
    """A submitted job and whether the server answered with an existing job for the same
    idempotency key (200 + `Idempotent-Replayed: true`) instead of creating one (201), or
    with the job of its debounce key (which absorbed it) or throttle key."""

    job: JobData
    replayed: bool
    debounced: bool = False
    throttled: bool = False

    @property
    def id(self) -> str:
        return str(self.job["id"])


@dataclass(frozen=True)
class SubmitReceipt:
    """What `submit_batch(..., return_jobs=False)` answers per item: the job's id and
    whether it was an idempotent replay (or answered by a debounce or throttle key), without
    the job."""

    id: str
    replayed: bool
    debounced: bool = False
    throttled: bool = False


@dataclass(frozen=True)
class JobPage:
    jobs: list[JobData]
    next: str | None
    """Cursor for the next page (`list_jobs(after=...)`), None on the last one."""


def _by_key(answer: Mapping[str, Any]) -> bool:
    """Whether a debounce or throttle key answered the submission with its job."""
    return answer.get("debounced") is True or answer.get("throttled") is True


def _result(job: JobData, status: int, replayed_header: bool = False) -> SubmitResult:
    return SubmitResult(
        job=job,
        replayed=(status == 200 or replayed_header) and not _by_key(job),
        debounced=job.get("debounced") is True,
        throttled=job.get("throttled") is True,
    )


_UNSET: Final = object()
_RETURN_MINIMAL: Final = {"Prefer": "return=minimal"}


def _segment(value: str | UUID) -> str:
    return quote(str(value), safe="")


def _schedule_path(name: str) -> str:
    return f"/v1/schedules/{_segment(name)}"


def _limit_path(key: str) -> str:
    return f"/v1/limits/{_segment(key)}"


def _fairness_path(key: str) -> str:
    return f"/v1/fairness/{_segment(key)}"


class Client:
    """Async client of the api service; one pooled connection set per instance.

    Use as `async with Client(url, token) as client:` or call `close()`. `timeout` bounds
    every call in seconds; `retries` is how many more times a call may be sent when that is
    safe (module docstring), waiting `retry_backoff` in between.

    An instance keeps the highest `Evora-Read-After` position the api answered it with and
    sends it on every call, so that an api reading from a replica shows it its own writes
    and never anything older than it showed it before (docs/http-api.md#read-after); two
    instances are two clients."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        retry_backoff: RetryBackoff | None = None,
    ) -> None:
        self._http = Transport(
            url, token, timeout=timeout, retries=retries, backoff=retry_backoff or RetryBackoff()
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.close()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool,
        body: Any = NO_BODY,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        return await self._http.request(
            method, path, body=body, params=params, idempotent=idempotent, headers=headers
        )

    # Producer endpoints

    async def submit(
        self, queue: str, type: str, payload: Any = _UNSET, **options: Unpack[SubmitOptions]
    ) -> SubmitResult:
        """Submit one job. `payload` defaults to the server's `{}`; pass None for JSON null.

        Raises `IdempotencyConflictError` when `idempotency_key` was used for this queue with
        different fields, `RequestValidationError` when a field breaks a rule."""
        body: dict[str, Any] = {"queue": queue, "type": type, **options}
        if payload is not _UNSET:
            body["payload"] = payload
        resp = await self._call(
            "POST",
            "/v1/jobs",
            body=body,
            idempotent="idempotency_key" in options,
            headers=context_headers(),
        )
        return _result(resp.data, resp.status, resp.headers.get("Idempotent-Replayed") == "true")

    @overload
    async def submit_batch(
        self, jobs: Iterable[Submission], *, return_jobs: Literal[True] = True
    ) -> list[SubmitResult]: ...

    @overload
    async def submit_batch(
        self, jobs: Iterable[Submission], *, return_jobs: Literal[False]
    ) -> list[SubmitReceipt]: ...

    async def submit_batch(
        self, jobs: Iterable[Submission], *, return_jobs: bool = True
    ) -> list[SubmitResult] | list[SubmitReceipt]:
        """Submit 1..1000 jobs in one transaction, all or nothing; results in request order.

        With `return_jobs=False` each result is a `SubmitReceipt` (id and replayed only):
        the api then answers `Prefer: return=minimal`, which spares it and this client
        the encoding and parsing of every whole job (most of a batch's cost on both).

        An invalid item raises `RequestValidationError` (its `errors` name the index) and
        stores nothing. Repeated after a lost answer only when every item has an
        idempotency key."""
        items = list(jobs)
        resp = await self._http.request(
            "POST",
            "/v1/jobs/batch",
            body={"jobs": items},
            idempotent=bool(items) and all("idempotency_key" in item for item in items),
            headers=(context_headers() or {}) | ({} if return_jobs else _RETURN_MINIMAL),
        )
        entries = resp.data["jobs"]
        if not return_jobs:
            return [
                SubmitReceipt(
                    str(e["id"]),
                    replayed=e["status"] == 200 and not _by_key(e),
                    debounced=e.get("debounced") is True,
                    throttled=e.get("throttled") is True,
                )
                for e in entries
            ]
        return [_result(e["job"], e["status"]) for e in entries]

    async def get(self, job_id: str | UUID) -> JobData:
        """The job; `JobNotFoundError` when there is none."""
        resp = await self._call("GET", f"/v1/jobs/{_segment(job_id)}", idempotent=True)
        data: JobData = resp.data
        return data

    async def events(self, job_id: str | UUID) -> list[dict[str, Any]]:
        """The job's events, oldest first (docs/http-api.md#the-event-resource)."""
        resp = await self._call("GET", f"/v1/jobs/{_segment(job_id)}/events", idempotent=True)
        events: list[dict[str, Any]] = resp.data["events"]
        return events

    async def resolve_callback(self, callback_id: str, payload: Any = None) -> dict[str, Any]:
        """Resolve a callback a job is suspended on (docs/callbacks.md): the job runs again
        and its handler sees `payload` in `job.callback`. Needs no token (the callback id is
        the credential). Answers the resolution `{callback, job_id, resolved_at, payload}`; a
        repeat answers the first one (so a retry is safe). `CallbackNotFoundError` for an
        unknown id, `CallbackSettledError` once it timed out or its job was cancelled."""
        resp = await self._call(
            "POST",
            f"/v1/callbacks/{_segment(callback_id)}",
            body={"payload": payload},
            idempotent=True,
        )
        resolution: dict[str, Any] = resp.data
        return resolution

    async def resolve_job(self, job_id: str | UUID, payload: Any = None) -> dict[str, Any]:
        """An admin's resolution of the callback the SUSPENDED job waits on, by the job (an
        approval): as `resolve_callback`."""
        resp = await self._call(
            "POST",
            f"/v1/jobs/{_segment(job_id)}/resolve",
            body={"payload": payload},
            idempotent=True,
        )
        resolution: dict[str, Any] = resp.data
        return resolution

    async def cancel(self, job_id: str | UUID) -> JobData:
        """Cancel a job: a PENDING, WAITING or SUSPENDED one is CANCELLED at once; a RUNNING
        one gets `cancel_requested` and becomes CANCELLED when its worker gives it up. Final
        states raise `InvalidStateError`."""
        return await self._to_cancelled(job_id, f"/v1/jobs/{_segment(job_id)}/cancel")

    # Admin endpoints

    async def list_jobs(
        self,
        *,
        queue: str | None = None,
        state: JobState | str | None = None,
        type: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> JobPage:
        """One page of jobs, newest first; pass `page.next` as `after` for the next one."""
        filters = {"queue": queue, "state": state, "type": type, "limit": limit, "after": after}
        params = {name: str(value) for name, value in filters.items() if value is not None}
        resp = await self._call("GET", "/v1/jobs", params=params, idempotent=True)
        return JobPage(jobs=resp.data["jobs"], next=resp.data.get("next"))

    async def dependents(
        self, job_id: str | UUID, *, limit: int | None = None, after: str | None = None
    ) -> JobPage:
        """One page of the jobs that depend on `job_id`, in submission order; pass
        `page.next` as `after` for the next one. `JobNotFoundError` when there is no such job."""
        params = {name: str(v) for name, v in {"limit": limit, "after": after}.items() if v}
        resp = await self._call(
            "GET", f"/v1/jobs/{_segment(job_id)}/dependents", params=params, idempotent=True
        )
        return JobPage(jobs=resp.data["jobs"], next=resp.data.get("next"))

    async def iter_jobs(
        self,
        *,
        queue: str | None = None,
        state: JobState | str | None = None,
        type: str | None = None,
        page_size: int | None = None,
    ) -> AsyncIterator[JobData]:
        """Every job matching the filters, newest first, fetching page after page."""
        after: str | None = None
        while True:
            page = await self.list_jobs(
                queue=queue, state=state, type=type, limit=page_size, after=after
            )
            for job in page.jobs:
                yield job
            if page.next is None:
                return
            after = page.next

    async def retry(self, job_id: str | UUID) -> JobData:
        """Move a DLQ job back to PENDING with a fresh attempt budget."""
        resp = await self._call("POST", f"/v1/jobs/{_segment(job_id)}/retry", idempotent=False)
        data: JobData = resp.data
        return data

    async def discard(self, job_id: str | UUID) -> JobData:
        """Move a DLQ job to CANCELLED."""
        return await self._to_cancelled(job_id, f"/v1/jobs/{_segment(job_id)}/discard")

    async def redrive(self, queue: str, type: str | None = None, limit: int | None = None) -> int:
        """Move the queue's DLQ jobs (optionally of one type, at most `limit`) to PENDING;
        returns how many moved."""
        body: dict[str, Any] = {}
        if type is not None:
            body["type"] = type
        if limit is not None:
            body["limit"] = limit
        resp = await self._call(
            "POST", f"/v1/queues/{_segment(queue)}/redrive", body=body, idempotent=False
        )
        return int(resp.data["redriven"])

    async def pause(self, queue: str) -> dict[str, Any]:
        """Stop handing out the queue's jobs (submissions are still accepted)."""
        resp = await self._call("POST", f"/v1/queues/{_segment(queue)}/pause", idempotent=True)
        return dict(resp.data or {})

    async def resume(self, queue: str) -> dict[str, Any]:
        resp = await self._call("POST", f"/v1/queues/{_segment(queue)}/resume", idempotent=True)
        return dict(resp.data or {})

    async def queues(self) -> list[dict[str, Any]]:
        """Stats of every queue by name, from the read models (eventually consistent),
        fetched a page at a time."""
        return await self._every_page("/v1/queues", "queues")

    async def stats(self, queue: str) -> dict[str, Any]:
        """Read-model stats of one queue; `QueueNotFoundError` for a queue never seen."""
        resp = await self._call("GET", f"/v1/queues/{_segment(queue)}/stats", idempotent=True)
        stats: dict[str, Any] = resp.data
        return stats

    async def workers(self) -> list[dict[str, Any]]:
        """Workers seen recently, from the read models."""
        resp = await self._call("GET", "/v1/workers", idempotent=True)
        data = resp.data
        workers: list[dict[str, Any]] = data["workers"] if isinstance(data, dict) else data
        return workers

    async def analytics(self) -> dict[str, Any]:
        """The latest `evora pipeline run` (docs/http-api.md#get-v1analytics): `ran`, its `as_of`,
        the projector's `projector_as_of`, and every queue by name with the pipeline's totals
        beside the projector's and whether they `agree`, fetched a page at a time."""
        return await self._all_pages("/v1/analytics", "queues")

    async def queue_analytics(self, queue: str) -> dict[str, Any]:
        """The latest `evora pipeline run` for each job type of `queue`
        (docs/http-api.md#get-v1analyticsqueuesqueue): `ran`, `as_of`, and `types`, `*` (all
        types together) first, each with its events, jobs by state, rates, latency and top
        failure reasons, fetched a page at a time."""
        return await self._all_pages(f"/v1/analytics/queues/{_segment(queue)}", "types")

    # Schedules (docs/schedules.md)

    async def put_schedule(
        self,
        name: str,
        cron: str,
        job: Submission,
        *,
        timezone: str | None = None,
        misfire: str | None = None,
        misfire_grace_seconds: int | None = None,
        paused: bool | None = None,
    ) -> dict[str, Any]:
        """Create or replace the schedule `name`: every tick of `cron` (five fields, read
        in `timezone`, default UTC) submits `job` (without an idempotency key). `misfire`
        is `skip`, `run_once` (the server's default) or `catch_up`. Returns the schedule;
        `RequestValidationError` for an invalid expression or zone."""
        given = {
            "timezone": timezone,
            "misfire": misfire,
            "misfire_grace_seconds": misfire_grace_seconds,
            "paused": paused,
        }
        body = {"cron": cron, "job": job} | {k: v for k, v in given.items() if v is not None}
        resp = await self._call("PUT", _schedule_path(name), body=body, idempotent=True)
        return dict(resp.data)

    async def schedules(self) -> list[dict[str, Any]]:
        """Every schedule by name, fetched a page at a time."""
        return await self._every_page("/v1/schedules", "schedules")

    async def schedule(self, name: str) -> dict[str, Any]:
        """The schedule with `next_run_at`, `last_run_at`, `last_job_id` and, when it failed
        to fire, `last_error` and `failing_since` (docs/schedules.md);
        `ScheduleNotFoundError` when there is none."""
        resp = await self._call("GET", _schedule_path(name), idempotent=True)
        return dict(resp.data)

    async def delete_schedule(self, name: str) -> None:
        """Delete the schedule; the jobs it made stay."""
        await self._delete(_schedule_path(name), ScheduleNotFoundError)

    async def pause_schedule(self, name: str) -> dict[str, Any]:
        """A paused schedule makes no jobs until resumed."""
        resp = await self._call("POST", f"{_schedule_path(name)}/pause", idempotent=True)
        return dict(resp.data)

    async def resume_schedule(self, name: str) -> dict[str, Any]:
        """Make jobs again from the next tick; ticks while paused make none."""
        resp = await self._call("POST", f"{_schedule_path(name)}/resume", idempotent=True)
        return dict(resp.data)

    async def trigger_schedule(self, name: str) -> JobData:
        """Make one job of the schedule now, outside its ticks; returns the job."""
        resp = await self._call("POST", f"{_schedule_path(name)}/trigger", idempotent=False)
        data: JobData = resp.data
        return data

    # Limits (docs/flow-control.md)

    async def set_limit(
        self,
        key: str,
        *,
        concurrency: int | None = None,
        rate: tuple[int, float] | None = None,
        max_pending: int | None = None,
    ) -> dict[str, Any]:
        """Create or replace the limit of `key` (`tenant:42`, `queue:<queue>`, or a prefix
        limit `tenant:*` that applies to every key under it separately): at most
        `concurrency` jobs holding the key RUNNING, at most `rate` = (limit, per_seconds)
        claims per period (a token bucket), and at most `max_pending` jobs holding it waiting
        to run (a submission over it raises `QueueFullError`). Returns the limit."""
        body = {
            "concurrency": concurrency,
            "rate": None if rate is None else {"limit": rate[0], "per_seconds": rate[1]},
            "max_pending": max_pending,
        }
        resp = await self._call("PUT", _limit_path(key), body=body, idempotent=True)
        return dict(resp.data)

    async def limits(self) -> list[dict[str, Any]]:
        """Every limit by key, fetched a page at a time."""
        return await self._every_page("/v1/limits", "limits")

    async def limit(self, key: str) -> dict[str, Any]:
        """The limit that governs `key` (its own or a prefix limit's) with the key's live
        usage: `running`, `tokens`, `throttled_jobs`; `LimitNotFoundError` when none does."""
        resp = await self._call("GET", _limit_path(key), idempotent=True)
        return dict(resp.data)

    async def room(self, key: str) -> int | None:
        """How many more jobs holding the concrete `key` a submission may add now under its
        max_pending (None: no max_pending governs it). Ask before a large batch: a batch is
        admitted whole or refused whole. Another producer may take the room meanwhile."""
        room: int | None = (await self.limit(key))["room"]
        return room

    async def delete_limit(self, key: str) -> None:
        """Delete the limit of `key`."""
        await self._delete(_limit_path(key), LimitNotFoundError)

    # Fairness weights (docs/flow-control.md, "Fairness keys")

    async def set_fairness(self, key: str, weight: float) -> dict[str, Any]:
        """Set the weight of a fairness key, or of a prefix (`gold:*`: every key under it
        weighs that much, each on its own); 0.001..1000, a key without one weighs 1."""
        resp = await self._call(
            "PUT", _fairness_path(key), body={"weight": weight}, idempotent=True
        )
        return dict(resp.data)

    async def fairness(self, key: str) -> dict[str, Any]:
        """The weight that applies to `key` (its own, a prefix's, else 1), who set it, and per
        queue what the fair claim served it."""
        resp = await self._call("GET", _fairness_path(key), idempotent=True)
        return dict(resp.data)

    async def fair_keys(
        self, queue: str | None = None, *, limit: int | None = None, after: str | None = None
    ) -> dict[str, Any]:
        """The fair queues and, with `queue`, one page of its keys in key order (`next`:
        pass it as `after`), each with its weight and who set it, due backlog, longest wait,
        and its share of the held lease time against its weight's share."""
        params = {
            name: str(value)
            for name, value in (("queue", queue), ("limit", limit), ("after", after))
            if value is not None
        }
        resp = await self._call("GET", "/v1/fairness", params=params, idempotent=True)
        return dict(resp.data)

    async def delete_fairness(self, key: str) -> None:
        """Drop the weight `key` set; its keys fall back to a prefix's, else 1."""
        await self._call("DELETE", _fairness_path(key), idempotent=True)

    async def _pages(self, path: str) -> AsyncIterator[dict[str, Any]]:
        """Every page of a keyset-paginated list, fetched one at a time."""
        params = {"limit": str(MAX_PAGE)}
        while True:
            resp = await self._call("GET", path, params=params, idempotent=True)
            yield resp.data
            # an api from before paging answers everything at once, without `next`
            after = resp.data.get("next")
            if after is None:
                return
            params["after"] = after

    async def _all_pages(self, path: str, field: str) -> dict[str, Any]:
        """A paginated answer whole: `field` from every page, the other fields from the last
        (a pipeline run that finished while paging is the one shown)."""
        pages = [page async for page in self._pages(path)]
        return {**pages[-1], field: [item for page in pages for item in page[field]]}

    async def _every_page(self, path: str, field: str) -> list[dict[str, Any]]:
        """Every item of a keyset-paginated list."""
        return [item async for page in self._pages(path) for item in page[field]]

    async def _delete(self, path: str, missing: type[EvoraClientError]) -> None:
        """DELETE, retried; `missing` (the resource's not-found error) is raised only when the
        resource was gone before this call, not when a retry finds what the first attempt
        deleted."""
        try:
            await self._call("DELETE", path, idempotent=True)
        except missing as exc:
            if exc.attempts == 1:
                raise

    async def _to_cancelled(self, job_id: str | UUID, path: str) -> JobData:
        try:
            resp = await self._call("POST", path, idempotent=True)
        except InvalidStateError as exc:
            # A repeat after a lost answer finds the job already moved by the first attempt.
            if exc.attempts > 1:
                job = await self.get(job_id)
                if job.get("state") == JobState.CANCELLED:
                    return job
            raise
        data: JobData = resp.data
        return data
