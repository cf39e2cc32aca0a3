"""The dashboard's analytics page in headless Chromium against the real api: before any
pipeline run the one command to run and the live totals; after one, the pipeline's totals
next to the live ones, whether they agree, and when it ran. (The documents are inserted in
the shape `evora pipeline run` writes; tests/pipeline/test_history.py checks a real run's.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from playwright.async_api import Page, expect

from evora.readmodels.layout import TOTAL_KEYS
from tests.dashboard.conftest import Dashboard, login


def queue_totals(queue: str, **totals: int) -> dict[str, Any]:
    return {
        "_id": queue,
        "queue": queue,
        "totals": {key: totals.get(key, 0) for key in TOTAL_KEYS},
        "by_event": {k: v for k, v in totals.items() if v},
        "events": sum(totals.values()),
        "run_id": "run-1",
        "as_of": {
            "run_id": "run-1",
            "at": datetime.now(UTC) - timedelta(minutes=3),
            "events": 7,
            "seq": 7,
            "below_xid": 1,
            "archive": {"upto_seq": 0, "below_xid": 0, "events": 0},
        },
    }


async def test_analytics_page_before_and_after_a_pipeline_run(
    dashboard: Dashboard, page: Page, shots: Any
) -> None:
    for queue in ("mail", "mail", "mail", "reports"):
        await dashboard.submit(queue=queue, type="t")
    await dashboard.complete_all("mail")
    await dashboard.caught_up()
    await login(page, dashboard.url)
    await page.get_by_role("link", name="Analytics").click()
    await expect(page.get_by_role("heading", name="Analytics", level=1)).to_be_visible()
    hint = page.locator("#analytics-never")
    await expect(hint).to_contain_text("The pipeline has not run yet")
    await expect(hint.locator("code")).to_have_text("evora pipeline run")
    await expect(page.locator("#analytics-ran")).to_have_text("never")
    mail = page.locator("tr[data-queue='mail']")
    await expect(mail.locator("[data-total='submitted']")).to_have_text("— / 3")
    await expect(mail.locator(".analytics-agree")).to_have_text("Not in the run")

    await dashboard.mongo["analytics_queue_totals"].insert_many(
        [
            queue_totals("mail", submitted=3, claimed=3, completed=3),
            queue_totals("reports", submitted=2),
        ]
    )
    await dashboard.mongo["analytics_rates"].insert_one(
        {"_id": "mail/*", "queue": "mail", "type": "*", "jobs": 3, "retried_jobs": 0, "retries": 0}
        | {"dead_lettered_jobs": 0, "retry_rate": 0.0, "dlq_rate": 0.0}
    )
    await page.get_by_role("button", name="Refresh").click()
    await expect(hint).to_have_count(0)
    await expect(page.locator("#analytics-ran")).to_contain_text("3 min ago")
    await expect(mail.locator("[data-total='submitted']")).to_have_text("3 / 3")
    await expect(mail.locator("[data-total='completed']")).to_have_text("3 / 3")
    await expect(mail.locator(".analytics-agree")).to_have_text("✓ Agree")
    await expect(mail.locator("td").nth(8)).to_have_text("0.0 %")  # retry rate
    reports = page.locator("tr[data-queue='reports']")
    await expect(reports.locator("[data-total='submitted']")).to_have_text("2 / 1")
    await expect(reports.locator("[data-total='submitted']")).to_have_class(
        "num nowrap analytics-differs"
    )
    await expect(reports.locator(".analytics-agree")).to_have_text("✕ Differ")
    await shots(page, "analytics")

    # one queue per job type
    await dashboard.mongo["analytics_rates"].insert_one(
        {"_id": "mail/t", "queue": "mail", "type": "t", "jobs": 3, "retried_jobs": 1}
        | {"retries": 1, "dead_lettered_jobs": 0, "retry_rate": 1 / 3, "dlq_rate": 0.0}
    )
    await dashboard.mongo["analytics_job_states"].insert_one(
        {"_id": "mail/t/COMPLETED", "queue": "mail", "type": "t", "state": "COMPLETED", "jobs": 3}
    )
    await dashboard.mongo["analytics_failure_reasons"].insert_one(
        {"_id": "mail/t/1", "queue": "mail", "type": "t", "rank": 1, "error_type": "IOError"}
        | {"message": "disk <n> full", "failures": 1, "last_at": datetime.now(UTC)}
    )
    await mail.get_by_role("link", name="mail").click()
    await expect(page).to_have_url(f"{dashboard.url}/#/analytics/mail")
    await expect(page.get_by_role("heading", name="Analytics of mail", level=1)).to_be_visible()
    await expect(page.get_by_role("link", name="Analytics")).to_have_attribute(
        "aria-current", "page"
    )
    all_types = page.locator("tr[data-type='*']")
    await expect(all_types.locator("th")).to_have_text("all types")
    await expect(all_types.locator("td").nth(2)).to_have_text("0.0 %")
    t = page.locator("tr[data-type='t']")
    await expect(t.locator("td").nth(0)).to_have_text("3")
    await expect(t.locator("td").nth(1)).to_have_text("COMPLETED 3")
    await expect(t.locator("td").nth(2)).to_have_text("33.3 %")
    await expect(t.locator(".analytics-failure")).to_have_text("IOError: disk <n> full (1)")
    await page.get_by_role("link", name="Queue mail now").click()
    await expect(page).to_have_url(f"{dashboard.url}/#/queues/mail")
