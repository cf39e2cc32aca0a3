"""The dashboard's schedules page in headless Chromium against the real api: next and last
run, the last job, and pause / resume / trigger."""

from __future__ import annotations

from typing import Any

from playwright.async_api import Page, expect

from tests.dashboard.conftest import ADMIN_TOKEN, Dashboard, login


async def put_schedule(dashboard: Dashboard, name: str, **fields: Any) -> None:
    body = {
        "cron": "0 9 * * *",
        "timezone": "Europe/Berlin",
        "job": {"queue": "reports", "type": "report.build"},
    }
    async with dashboard.http.put(
        f"{dashboard.url}/v1/schedules/{name}",
        json=body | fields,
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as response:
        assert response.status == 201, await response.text()


async def test_schedules_page_pause_resume_trigger(
    dashboard: Dashboard, page: Page, shots: Any
) -> None:
    await put_schedule(dashboard, "nightly-report")
    await login(page, dashboard.url)
    await page.get_by_role("link", name="Schedules").click()
    await expect(page.get_by_role("heading", name="Schedules", level=1)).to_be_visible()
    row = page.locator("tr[data-schedule='nightly-report']")
    await expect(row).to_contain_text("0 9 * * *")
    await expect(row).to_contain_text("Europe/Berlin")
    await expect(row).to_contain_text("reports / report.build")
    await expect(row.locator(".schedule-state")).to_have_text("▶ Active")
    await expect(row.locator("td").nth(5)).to_contain_text("in ")  # the next run
    await shots(page, "schedules")

    await row.get_by_role("button", name="Pause schedule nightly-report").click()
    await expect(row.locator(".schedule-state")).to_have_text("‖ Paused")
    await expect(page.get_by_role("status")).to_contain_text("paused")
    assert await dashboard.pool.fetchval("SELECT paused FROM evora.schedules")

    await row.get_by_role("button", name="Trigger schedule nightly-report now").click()
    await expect(page.get_by_role("status")).to_contain_text("triggered")
    job_id = await dashboard.pool.fetchval("SELECT last_job_id FROM evora.schedules")
    link = row.get_by_role("link", name=f"Job {job_id}")
    await expect(link).to_be_visible()
    await expect(row.locator("td").nth(6)).to_contain_text("ago")  # the last run

    await row.get_by_role("button", name="Resume schedule nightly-report").click()
    await expect(row.locator(".schedule-state")).to_have_text("▶ Active")
    await link.click()
    await expect(page).to_have_url(f"{dashboard.url}/#/jobs/{job_id}")


async def test_a_failing_schedule_shows_its_error(dashboard: Dashboard, page: Page) -> None:
    await put_schedule(dashboard, "broken")
    await put_schedule(dashboard, "fine")
    await dashboard.pool.execute(
        "UPDATE evora.schedules SET last_error = $1, last_error_at = now(), failing_since = now(), "
        "consecutive_failures = 3 WHERE name = 'broken'",
        {"message": "depends_on[0]: a dependency names no job", "type": "validation_error"},
    )
    await login(page, dashboard.url)
    await page.get_by_role("link", name="Schedules").click()
    broken = page.locator("tr[data-schedule='broken']")
    await expect(broken.locator(".schedule-state")).to_contain_text("Failing: 3 in a row")
    await expect(broken).to_contain_text("a dependency names no job")
    fine = page.locator("tr[data-schedule='fine']")
    await expect(fine.locator(".schedule-state")).to_have_text("▶ Active")
