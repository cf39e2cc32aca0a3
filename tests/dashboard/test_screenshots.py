"""The main pages with a realistic workload, photographed for the README.

Screenshots go to a temporary folder; `EVORA_SCREENSHOTS=1 bash scripts/test.sh
tests/dashboard -k screenshots` writes them to docs/screenshots/ instead.
"""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from typing import Any

from playwright.async_api import Page, expect

from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import Completion, Failure
from tests.dashboard.conftest import Dashboard, login

QUEUES: dict[str, tuple[list[str], str]] = {
    "emails": (["email.send", "email.digest"], "mailer-7f3c@app-1"),
    "reports": (["report.render"], "reporter-21aa@batch-2"),
    "thumbnails": (["image.resize", "image.crop"], "media-0b9e@gpu-1"),
    "webhooks": (["webhook.deliver"], "hooks-5d20@app-2"),
}
FATAL = {
    "emails": ("SMTPRecipientsRefused", "550 5.1.1 mailbox unavailable: bounce@example.net"),
    "reports": ("TemplateError", "unknown column 'region' in report 'quarterly-sales'"),
    "thumbnails": ("DecompressionBombError", "image of 189 megapixels exceeds the limit"),
    "webhooks": ("HTTPError", "410 Gone from https://hooks.example.com/orders"),
}
RETRYABLE = ("TimeoutError", "no answer within 30 s")


def payload(queue: str, rng: random.Random, n: int) -> dict[str, Any]:
    if queue == "emails":
        return {"to": f"user{n}@example.com", "template": rng.choice(["welcome", "receipt"])}
    if queue == "reports":
        return {"report": "quarterly-sales", "format": "pdf", "year": 2026}
    if queue == "thumbnails":
        return {"image": f"uploads/{n:05d}.jpg", "sizes": [64, 256, 1024]}
    return {"url": "https://hooks.example.com/orders", "event": "order.paid", "order": n}


async def work_round(dashboard: Dashboard, rng: random.Random, round_no: int) -> None:
    store = dashboard.store
    now = datetime.now(UTC)
    for queue, (types, _) in QUEUES.items():
        await store.submit_batch(
            [
                JobSubmission(
                    queue=queue,
                    type=rng.choice(types),
                    payload=payload(queue, rng, round_no * 100 + i),
                    max_attempts=3,
                    run_at=now - timedelta(seconds=rng.uniform(0.05, 4.0)),
                )
                for i in range(rng.randrange(15, 40))
            ]
        )
    claimed = {
        queue: await store.claim(worker_id=worker, queues=[queue], max_jobs=rng.randrange(12, 30))
        for queue, (_, worker) in QUEUES.items()
    }
    await asyncio.sleep(0.25)  # the jobs "run"
    for queue, jobs in claimed.items():
        completions, failures = [], []
        for job in jobs:
            roll = rng.random()
            if roll < 0.78:
                completions.append(Completion(job["id"], job["lease_token"], {"ok": True}))
            elif roll < 0.88:
                kind, message = RETRYABLE
                failures.append(
                    Failure(job["id"], job["lease_token"], message, kind, retry_in_seconds=0)
                )
            elif roll < 0.95:
                kind, message = FATAL[queue]
                failures.append(
                    Failure(job["id"], job["lease_token"], message, kind, retryable=False)
                )
            # else: still running
        await store.complete_many(completions)
        await store.fail_many(failures)


async def a_job_with_history(dashboard: Dashboard) -> str:
    """A welcome email that timed out once and was then sent."""
    store = dashboard.store
    [submitted] = await store.submit_batch(
        [
            JobSubmission(
                queue="emails",
                type="email.send",
                payload={
                    "to": "ada@example.com",
                    "template": "welcome",
                    "locale": "en-GB",
                    "vars": {"name": "Ada", "plan": "team"},
                },
                priority=-100,
                idempotency_key="signup-ada-2026-11-22",
            )
        ]
    )
    job_id = submitted.job["id"]
    [first] = await store.claim(worker_id="mailer-7f3c@app-1", queues=["emails"])
    assert first["id"] == job_id
    await asyncio.sleep(0.2)
    await store.fail(
        Failure(
            job_id,
            first["lease_token"],
            "SMTP server did not answer within 30 s",
            "TimeoutError",
            retry_in_seconds=0,
        )
    )
    [second] = await store.claim(worker_id="mailer-9a01@app-2", queues=["emails"])
    assert second["id"] == job_id
    await asyncio.sleep(0.15)
    await store.complete(
        job_id, second["lease_token"], {"message_id": "<20261122.ada@mail.example.com>"}
    )
    return str(job_id)


async def a_workflow_half_done(dashboard: Dashboard) -> str:
    """A nightly report: one export fans out to four per-region aggregations, and a render
    waits for all four; two are done, one is running, one still due. Returns the render."""
    store = dashboard.store
    regions = ["emea", "amer", "apac", "latam"]
    [export] = await store.submit_batch(
        [JobSubmission(queue="nightly", type="report.export", payload={"day": "2026-11-23"})]
    )
    export_id = export.job["id"]
    parts = await store.submit_batch(
        [
            JobSubmission(
                queue="nightly",
                type="report.aggregate",
                payload={"region": region},
                depends_on=[export_id],
            )
            for region in regions
        ]
    )
    [render] = await store.submit_batch(
        [
            JobSubmission(
                queue="nightly",
                type="report.render",
                payload={"report": "nightly-sales"},
                depends_on=[p.job["id"] for p in parts],
            )
        ]
    )
    [first] = await store.claim(worker_id="reporter-21aa@batch-2", queues=["nightly"])
    assert first["id"] == export_id
    await store.complete(export_id, first["lease_token"], {"rows": 48_211})
    claimed = await store.claim(worker_id="reporter-21aa@batch-2", queues=["nightly"], max_jobs=3)
    assert len(claimed) == 3
    for job in claimed[:2]:
        await store.complete(job["id"], job["lease_token"], {"ok": True})
    return str(render.job["id"])


async def test_main_pages_with_a_realistic_workload(
    dashboard: Dashboard, page: Page, shots: Any
) -> None:
    rng = random.Random(20261122)
    job_id = await a_job_with_history(dashboard)
    await login(page, dashboard.url)
    # a few rounds of work; the trend lines are the read models' per-minute history
    for round_no in range(4):
        await work_round(dashboard, rng, round_no)
    render = await a_workflow_half_done(dashboard)
    await dashboard.caught_up()
    await page.get_by_role("button", name="Refresh").click()
    await expect(page.locator("#queues-table tbody tr")).to_have_count(5)
    await dashboard.store.pause("thumbnails")
    await page.get_by_role("button", name="Refresh").click()
    await expect(page.locator("tr[data-queue='thumbnails']")).to_contain_text("Paused")
    await expect(page.locator("tr[data-queue='webhooks'] svg.sparkline polyline")).to_have_count(1)
    await shots(page, "overview")

    await page.get_by_role("link", name="emails", exact=True).click()
    await expect(page.get_by_role("heading", name="Throughput")).to_be_visible()
    await expect(page.locator(".jobs-table tbody tr")).to_have_count(25)
    await shots(page, "queue")

    await page.goto(f"{dashboard.url}/#/jobs/{job_id}")
    await expect(page.locator("#timeline > li")).to_have_count(5)
    await shots(page, "job")

    await page.goto(f"{dashboard.url}/#/jobs/{render}")
    await expect(page.locator("#dependency-graph a.graph-node")).to_have_count(4)
    await shots(page, "workflow")

    await page.get_by_role("link", name="Dead letters").click()
    await expect(page.locator(".jobs-table tbody tr").first).to_be_visible()
    await shots(page, "dlq")

    await page.get_by_role("link", name="Workers").click()
    await expect(page.locator("#workers-table tbody tr")).to_have_count(5)
    await shots(page, "workers")
