"""Telling the dispatcher how jobs ended: outcomes go through the `AckBatcher`, each batch
with the worker's next claim when that claim is due now (`carry`: one request instead of
two), otherwise in `POST /v1/acks` (one by one when the dispatcher rejects a whole batch, so
one bad item does not sink the others); releases go one at a time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from evora.protocol.bounds import MAX_ERROR_MESSAGE
from evora.protocol.retries import RETRYABLE_STATUSES, RetryBackoff
from evora.sdk._http import Transport
from evora.sdk.acks import Ack, AckBatcher
from evora.sdk.errors import (
    EvoraClientError,
    EvoraHTTPError,
    JobNotFoundError,
    LeaseLostError,
)
from evora.sdk.handlers import Job

if TYPE_CHECKING:
    from evora.sdk.client import Submission

log = logging.getLogger("evora.worker")


CarryAcks = Callable[[Sequence[Ack]], Awaitable[list[dict[str, Any]]] | None]
"""Hands a batch to a claim about to be sent, which answers its `results` (or raises as the
claim failed); None when no claim is due now."""


class Reports:
    def __init__(
        self,
        http: Transport,
        *,
        max_batch: int,
        linger: float,
        expect_more: Callable[[], bool],
        backoff: RetryBackoff,
        carry: CarryAcks | None = None,
    ) -> None:
        self._http = http
        self._carry = carry
        self._batcher = AckBatcher(
            self._send_acks,
            max_batch=max_batch,
            linger=linger,
            expect_more=expect_more,
            backoff=backoff,
        )

    def start(self) -> None:
        self._batcher.start()

    async def close(self, *, within: float) -> None:
        """Send what is still queued, for at most `within` seconds."""
        await self._batcher.close(within=within)

    async def release(self, job: Job) -> None:
        try:
            await self._http.request(
                "POST",
                f"/v1/jobs/{job.id}/release",
                body={"lease_token": job.lease_token},
                idempotent=True,
            )
        except (LeaseLostError, JobNotFoundError) as exc:
            log.info("job %s: nothing to release (%s)", job.id, exc)
            return
        log.info("job %s released", job.id)

    async def snooze(self, job: Job, seconds: float) -> None:
        try:
            await self._http.request(
                "POST",
                f"/v1/jobs/{job.id}/snooze",
                body={"lease_token": job.lease_token, "delay_seconds": seconds},
                idempotent=True,
            )
        except (LeaseLostError, JobNotFoundError) as exc:
            log.info("job %s: nothing to snooze (%s)", job.id, exc)
            return
        log.info("job %s snoozed for %s s", job.id, seconds)

    async def suspend(self, job: Job, timeout_seconds: float, on_timeout: str) -> str | None:
        """Suspend the job on a callback; its callback id, or None when a requested cancel
        won (the job is CANCELLED)."""
        resp = await self._http.request(
            "POST",
            f"/v1/jobs/{job.id}/suspend",
            idempotent=False,
            body={
                "lease_token": job.lease_token,
                "timeout_seconds": timeout_seconds,
                "on_timeout": on_timeout,
            },
        )
        callback_id: str | None = resp.data["callback_id"]
        log.info("job %s suspended on a callback for at most %s s", job.id, timeout_seconds)
        return callback_id

    async def spawn_children(
        self, job: Job, jobs: Sequence[Submission], on_dependency_failure: str | None
    ) -> list[str] | None:
        """Submit the job's children and make it wait for them; their ids, or None when a
        requested cancel won (nothing was submitted, the job is CANCELLED)."""
        body: dict[str, Any] = {"lease_token": job.lease_token, "jobs": list(jobs)}
        if on_dependency_failure is not None:
            body["on_dependency_failure"] = on_dependency_failure
        resp = await self._http.request(
            "POST", f"/v1/jobs/{job.id}/children", idempotent=False, body=body
        )
        if not resp.data["children"]:
            return None
        log.info("job %s waits for %d children", job.id, len(resp.data["children"]))
        return [str(child["id"]) for child in resp.data["children"]]

    def report(self, ack: Ack, on_sent: Callable[[], None] | None = None) -> asyncio.Future[int]:
        """Report an outcome; the future resolves to its status once the dispatcher has
        recorded it. `on_sent` runs when it goes out (see `AckBatcher.submit`). A job's task
        awaits that future itself, with no coroutine of this class between: one object and
        one frame fewer per job. What the status means is logged with the batch's answer."""
        return self._batcher.submit(ack, on_sent)

    async def _send_acks(self, acks: Sequence[Ack]) -> dict[str, int]:
        statuses = await self._delivered(acks)
        for ack in acks:
            if statuses[ack.job_id] != 200:
                _log_refused(ack.job_id, statuses[ack.job_id])
        return statuses

    async def _delivered(self, acks: Sequence[Ack]) -> dict[str, int]:
        carried = None if self._carry is None else self._carry(acks)
        try:
            if carried is not None:
                try:
                    results = await carried
                finally:
                    # A failed future holds its exception, whose traceback holds this frame,
                    # which would hold the future: a cycle keeping the batch's outcomes and
                    # jobs for the cyclic collector. Dropped, they are freed as they end.
                    del carried
            else:
                resp = await self._http.request(
                    "POST",
                    "/v1/acks",
                    body={"acks": [ack.item() for ack in acks]},
                    idempotent=True,
                    retries=0,
                )
                results = resp.data["results"]
        except EvoraHTTPError as exc:
            if exc.status in RETRYABLE_STATUSES:
                raise
            # One bad item (a result over the size limit, say) must not sink the others.
            log.warning(
                "the dispatcher rejected a batch of %d outcomes (%s); sending them one by one",
                len(acks),
                exc,
            )
            return {ack.job_id: await self._send_one(ack) for ack in acks}
        statuses = {str(item["id"]): int(item["status"]) for item in results}
        missing = [ack.job_id for ack in acks if ack.job_id not in statuses]
        if missing:
            raise EvoraClientError(f"the dispatcher's answer lacks jobs {', '.join(missing)}")
        return statuses

    async def _send_one(self, ack: Ack) -> int:
        try:
            await self._http.request(
                "POST",
                f"/v1/jobs/{ack.job_id}/{ack.outcome}",
                body=ack.endpoint_body(),
                idempotent=True,
                retries=0,
            )
        except EvoraHTTPError as exc:
            if exc.status in RETRYABLE_STATUSES:
                raise
            if exc.status in (404, 409):
                return exc.status
            if ack.outcome == "complete":
                log.error("job %s: the dispatcher rejected its result (%s)", ack.job_id, exc)
                message = f"the dispatcher rejected the result: {exc}"[:MAX_ERROR_MESSAGE]
                error = {"message": message, "type": type(exc).__name__, "retryable": False}
                return await self._send_one(Ack(ack.job_id, ack.lease_token, "fail", error=error))
            log.error("job %s: the dispatcher rejected its failure report (%s)", ack.job_id, exc)
            return exc.status
        return 200


def _log_refused(job_id: str, status: int) -> None:
    # Out of the job's task: the record names the job in its fields, as the task's would.
    fields = {"job_id": job_id}
    if status == 409:
        log.warning(
            "job %s: its lease was lost before the outcome was recorded; the job was "
            "taken away (another attempt owns it now)",
            job_id,
            extra=fields,
        )
    elif status == 404:
        log.warning("job %s no longer exists; its outcome was dropped", job_id, extra=fields)
    else:
        log.error("job %s: the dispatcher answered %d to its outcome", job_id, status, extra=fields)
