"""The dashboard's limits panel in headless Chromium against the real api: every limit with
its usage (RUNNING holders out of the concurrency, tokens, jobs held back and for how long),
the keys under a prefix limit a page at a time, and setting, editing and deleting a limit."""

from __future__ import annotations

from typing import Any

from playwright.async_api import Page, expect

from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import Failure
from tests.dashboard.conftest import ADMIN_TOKEN, Dashboard, login

QUEUE = "api-calls"


async def put_limit(dashboard: Dashboard, key: str, body: dict[str, Any]) -> None:
    async with dashboard.http.put(
        f"{dashboard.url}/v1/limits/{key}",
        json=body,
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as response:
        assert response.status == 201, await response.text()


async def submit(dashboard: Dashboard, keys: list[list[str]]) -> None:
    await dashboard.store.submit_batch(
        [JobSubmission(queue=QUEUE, type="call", limit_keys=k) for k in keys]
    )


async def test_a_key_at_its_concurrency_shows_its_usage_and_held_back_jobs(
    dashboard: Dashboard, page: Page, shots: Any
) -> None:
    await put_limit(dashboard, "tenant:*", {"concurrency": 5, "rate": None})
    await put_limit(
        dashboard, "api:stripe", {"concurrency": None, "rate": {"limit": 10, "per_seconds": 3600}}
    )
    await submit(dashboard, [["tenant:42", "api:stripe"]] * 7)
    claimed = await dashboard.store.claim(worker_id="w", queues=[QUEUE], max_jobs=20)
    assert len(claimed) == 5  # tenant:42 is at its concurrency; two are held back

    await login(page, dashboard.url)
    await page.get_by_role("link", name="Limits").click()
    await expect(page.get_by_role("heading", name="Limits", level=1)).to_be_visible()
    prefix = page.locator("tr[data-limit='tenant:*']")
    await expect(prefix.locator(".limit-running")).to_have_text("5 / 5")
    await expect(prefix.locator(".limit-running")).to_have_class("num limit-running at-limit")
    await expect(prefix.locator(".limit-held")).to_have_text("2")
    await expect(prefix.locator(".limit-throttled")).to_contain_text(" s")
    await expect(prefix.locator("td").nth(0)).to_have_text("prefix")
    stripe = page.locator("tr[data-limit='api:stripe']")
    await expect(stripe).to_contain_text("10 per 3,600 s")
    await expect(stripe.locator(".limit-running")).to_have_text("5")
    await expect(stripe.locator(".limit-tokens")).to_have_text("5")
    await expect(stripe.locator(".limit-held")).to_have_text("0")
    await shots(page, "limits")

    await prefix.get_by_role("link", name="tenant:*").click()
    await expect(page.get_by_role("heading", name="Limit tenant:*", level=1)).to_be_visible()
    key = page.locator("tr[data-key='tenant:42']")
    await expect(key.locator(".limit-running")).to_have_text("5 / 5")
    await expect(key.locator(".limit-held")).to_have_text("2")
    nav = page.get_by_role("link", name="Limits", exact=True)
    await expect(nav).to_have_attribute("aria-current", "page")


async def test_a_key_an_upstream_throttles_shows_until_when(
    dashboard: Dashboard, page: Page
) -> None:
    await put_limit(dashboard, "api:github", {"concurrency": 3, "rate": None})
    await submit(dashboard, [["api:github"]] * 2)
    [job] = await dashboard.store.claim(worker_id="w", queues=[QUEUE], max_jobs=1)
    await dashboard.store.fail(
        Failure(
            job["id"], job["lease_token"], "429", retry_in_seconds=600, retry_after_key="api:github"
        )
    )

    await login(page, dashboard.url)
    await page.get_by_role("link", name="Limits").click()
    row = page.locator("tr[data-limit='api:github']")
    await expect(row.locator(".limit-upstream time")).to_be_visible()
    await expect(row.locator(".limit-held")).to_have_text("1")  # the other one: due, held back
    await row.get_by_role("link", name="api:github").click()
    key = page.locator("tr[data-key='api:github']")
    await expect(key.locator(".limit-upstream time")).to_be_visible()


async def test_the_keys_under_a_prefix_come_a_page_at_a_time(
    dashboard: Dashboard, page: Page
) -> None:
    await put_limit(dashboard, "tenant:*", {"concurrency": 1, "rate": None})
    tenants = [f"tenant:{n:03}" for n in range(55)]
    await submit(dashboard, [[t] for t in tenants])
    assert len(await dashboard.store.claim(worker_id="w", queues=[QUEUE], max_jobs=100)) == 55

    await login(page, dashboard.url)
    await page.goto(dashboard.url + "/#/limits/tenant%3A*")
    rows = page.locator("#limit-keys-table tbody tr")
    await expect(rows).to_have_count(50)
    await expect(rows.first).to_have_attribute("data-key", "tenant:000")
    await page.get_by_role("button", name="Next →").click()
    await expect(rows).to_have_count(5)
    await expect(rows.first).to_have_attribute("data-key", "tenant:050")
    await expect(rows.last.locator(".limit-running")).to_have_text("1 / 1")
    await page.get_by_role("button", name="← Previous").click()
    await expect(rows).to_have_count(50)


async def test_set_edit_and_delete_a_limit(dashboard: Dashboard, page: Page) -> None:
    await login(page, dashboard.url)
    await page.goto(dashboard.url + "/#/limits")
    await expect(page.get_by_text("No limits yet")).to_be_visible()

    await page.get_by_label("Key").fill("api:new")
    await page.get_by_label("Concurrency").fill("3")
    await page.get_by_label("Rate (claims)").fill("20")
    await page.get_by_label("per seconds").fill("60")
    await page.get_by_label("Max pending").fill("100")
    await page.get_by_role("button", name="Save limit").click()
    row = page.locator("tr[data-limit='api:new']")
    await expect(row).to_contain_text("20 per 60 s")
    await expect(row.locator(".limit-running")).to_have_text("0 / 3")
    stored = await dashboard.pool.fetchrow("SELECT * FROM evora.flow_limits WHERE key = 'api:new'")
    assert (stored["concurrency"], stored["rate_limit"], stored["rate_per_seconds"]) == (3, 20, 60)
    assert stored["max_pending"] == 100

    await row.get_by_role("button", name="Edit limit api:new").click()
    await expect(page.get_by_label("Concurrency")).to_have_value("3")
    # the edit keeps the max_pending the limit has (a PUT replaces the whole limit)
    await expect(page.get_by_label("Max pending")).to_have_value("100")
    await page.get_by_label("Concurrency").fill("7")
    await page.get_by_role("button", name="Save limit").click()
    await expect(row.locator(".limit-running")).to_have_text("0 / 7")
    max_pending = "SELECT max_pending FROM evora.flow_limits WHERE key = 'api:new'"
    assert await dashboard.pool.fetchval(max_pending) == 100

    # a rate needs both halves: nothing is sent
    await page.get_by_label("Key").fill("api:half")
    await page.get_by_label("Rate (claims)").fill("5")
    await page.get_by_label("per seconds").fill("")
    await page.get_by_role("button", name="Save limit").click()
    await expect(page.get_by_role("alert")).to_contain_text("A rate needs both")

    await row.get_by_role("button", name="Delete limit api:new").click()
    await page.get_by_role("dialog").get_by_role("button", name="Delete").click()
    await expect(row).to_have_count(0)
    assert await dashboard.pool.fetchval("SELECT count(*) FROM evora.flow_limits") == 0
