"""The dashboard's Fairness page in headless Chromium against the real api: the fair queues,
a queue's keys a page at a time with their weight (their own, a prefix's, or the default),
due backlog, longest wait and shares, and setting and deleting a weight."""

from __future__ import annotations

from typing import Any

from playwright.async_api import Page, expect

from evora.protocol.jobs import JobSubmission
from tests.dashboard.conftest import ADMIN_TOKEN, Dashboard, login

QUEUE = "tenants"


async def put_weight(dashboard: Dashboard, key: str, weight: float) -> None:
    async with dashboard.http.put(
        f"{dashboard.url}/v1/fairness/{key}",
        json={"weight": weight},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as response:
        assert response.status == 201, await response.text()


async def submit(dashboard: Dashboard, keys: list[str]) -> None:
    await dashboard.store.submit_batch(
        [JobSubmission(queue=QUEUE, type="call", fairness_key=k) for k in keys]
    )


async def test_a_queues_keys_with_their_weights_backlog_and_shares(
    dashboard: Dashboard, page: Page, shots: Any
) -> None:
    await put_weight(dashboard, "gold:*", 3)
    # idle's one job runs and ends: it has no backlog, and all the lease time held
    await submit(dashboard, ["idle"])
    [job] = await dashboard.store.claim(worker_id="w", queues=[QUEUE], max_jobs=1)
    await submit(dashboard, ["gold:acme"] * 3 + ["free:a"])
    await dashboard.store.complete(job["id"], job["lease_token"])
    # a claim that takes nothing (no job of its type) settles the ending
    assert await dashboard.store.claim(worker_id="w", queues=[QUEUE], types=["none"]) == []

    await login(page, dashboard.url)
    await page.get_by_role("link", name="Fairness").click()
    await expect(page.get_by_role("heading", name="Fairness", level=1)).to_be_visible()
    queue = page.locator(f"tr[data-queue='{QUEUE}']")
    await expect(queue.locator(".fair-keys")).to_have_text("3")

    await queue.get_by_role("link", name=QUEUE).click()
    await expect(page.get_by_role("heading", name=f"Fairness {QUEUE}", level=1)).to_be_visible()
    gold = page.locator("tr[data-key='gold:acme']")
    await expect(gold.locator(".fair-weight")).to_have_text("3")
    await expect(gold.locator(".fair-set-by")).to_have_text("prefix gold:*")
    await expect(gold.locator(".fair-backlog")).to_have_text("3")
    await expect(gold.locator(".fair-wait")).to_contain_text(" s")
    await expect(gold.locator(".fair-weight-share")).to_have_text("60 %")  # 3 of 5
    await expect(gold.locator(".fair-held-share")).to_have_text("0 %")
    idle = page.locator("tr[data-key='idle']")
    await expect(idle.locator(".fair-weight")).to_have_text("1")
    await expect(idle.locator(".fair-set-by")).to_have_text("default")
    await expect(idle.locator(".fair-backlog")).to_have_text("0")
    await expect(idle.locator(".fair-wait")).to_have_text("—")
    await expect(idle.locator(".fair-held-share")).to_have_text("100 %")
    await expect(idle.locator(".fair-weight-share")).to_have_text("20 %")
    await shots(page, "fairness")
    nav = page.get_by_role("link", name="Fairness", exact=True)
    await expect(nav).to_have_attribute("aria-current", "page")


async def test_set_and_delete_a_weight(dashboard: Dashboard, page: Page) -> None:
    await submit(dashboard, ["free:a", "free:b"])
    await put_weight(dashboard, "free:*", 2)
    assert await dashboard.store.claim(worker_id="w", queues=[QUEUE], types=["none"]) == []
    await login(page, dashboard.url)
    await page.goto(f"{dashboard.url}/#/fairness/{QUEUE}")
    row = page.locator("tr[data-key='free:a']")
    await expect(row.locator(".fair-set-by")).to_have_text("prefix free:*")

    await page.get_by_label("Key", exact=True).fill("free:a")
    await page.get_by_label("Weight", exact=True).fill("5")
    await page.get_by_role("button", name="Save weight").click()
    await expect(row.locator(".fair-weight")).to_have_text("5")
    await expect(row.locator(".fair-set-by")).to_have_text("own")
    stored = "SELECT weight FROM evora.fairness_weights WHERE key = 'free:a'"
    assert await dashboard.pool.fetchval(stored) == 5

    # out of range: refused by the api, nothing stored
    await page.get_by_label("Key", exact=True).fill("free:b")
    await page.get_by_label("Weight", exact=True).fill("0")
    await page.get_by_role("button", name="Save weight").click()
    await expect(page.get_by_role("alert")).to_contain_text("Could not save")

    await row.get_by_role("button", name="Delete weight free:a").click()
    await page.get_by_role("dialog").get_by_role("button", name="Delete").click()
    await expect(row.locator(".fair-set-by")).to_have_text("prefix free:*")
    await expect(row.locator(".fair-weight")).to_have_text("2")
    assert await dashboard.pool.fetchval("SELECT count(*) FROM evora.fairness_weights") == 1


async def test_a_queues_keys_come_a_page_at_a_time(dashboard: Dashboard, page: Page) -> None:
    await submit(dashboard, [f"tenant:{n:03}" for n in range(53)])
    # the keys have rows once a claim folded their submissions
    assert await dashboard.store.claim(worker_id="w", queues=[QUEUE], types=["none"]) == []

    await login(page, dashboard.url)
    await page.goto(f"{dashboard.url}/#/fairness/{QUEUE}")
    rows = page.locator("#fair-keys-table tbody tr")
    await expect(rows).to_have_count(50)
    await expect(rows.first).to_have_attribute("data-key", "tenant:000")
    await page.get_by_role("button", name="Next →").click()
    await expect(rows).to_have_count(3)
    await expect(rows.first).to_have_attribute("data-key", "tenant:050")
    await expect(rows.last.locator(".fair-backlog")).to_have_text("1")
    await page.get_by_role("button", name="← Previous").click()
    await expect(rows).to_have_count(50)
