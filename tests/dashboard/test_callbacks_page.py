"""A SUSPENDED job on the dashboard (docs/callbacks.md): its page says what callback it waits
for and until when, and an admin resolves it (a person's approval) with a JSON payload, or
cancels it."""

from __future__ import annotations

from playwright.async_api import Page, expect

from tests.dashboard.conftest import Dashboard, login


async def suspended(dashboard: Dashboard, queue: str) -> dict[str, object]:
    job = await dashboard.submit(queue=queue, type="approve")
    [claimed] = await dashboard.store.claim(worker_id="w", queues=[queue])
    await dashboard.store.suspend(
        claimed["id"], claimed["lease_token"], timeout_seconds=3600, on_timeout="dlq"
    )
    return job


async def test_an_admin_resolves_a_suspended_job(dashboard: Dashboard, page: Page) -> None:
    job = await suspended(dashboard, "approvals")
    await login(page, dashboard.url)
    await page.goto(f"{dashboard.url}/#/jobs/{job['id']}")
    await expect(page.locator("main .title-row .state")).to_have_text("SUSPENDED")
    await expect(page.locator("dd", has=page.locator("#callback-id"))).to_contain_text("(then dlq)")

    await page.get_by_role("button", name="Resolve…").click()
    dialog = page.get_by_role("dialog", name="Resolve its callback?")
    await dialog.get_by_label("Payload (JSON)").fill('{"approved": true}')
    await dialog.get_by_role("button", name="Resolve").click()
    await expect(page.locator("main .title-row .state")).to_have_text("PENDING")
    stored = await dashboard.store.get(job["id"])  # type: ignore[arg-type]
    assert stored["callback"]["payload"] == {"approved": True}
    await expect(page.get_by_role("button", name="Resolve…")).to_have_count(0)


async def test_an_admin_cancels_a_suspended_job(dashboard: Dashboard, page: Page) -> None:
    job = await suspended(dashboard, "approvals")
    await login(page, dashboard.url)
    await page.goto(f"{dashboard.url}/#/jobs/{job['id']}")
    await page.get_by_role("button", name="Cancel job…").click()
    dialog = page.get_by_role("dialog", name="Cancel this job?")
    await dialog.get_by_role("button", name="Cancel job").click()
    await expect(page.locator("main .title-row .state")).to_have_text("CANCELLED")
    assert (await dashboard.store.get(job["id"]))["state"] == "CANCELLED"  # type: ignore[arg-type]
