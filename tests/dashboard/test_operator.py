"""The dashboard as an operator uses it during an incident: ids that can be told apart and
copied, times that say their date and zone, no made-up figures, no buttons that do nothing."""

from __future__ import annotations

import re

from playwright.async_api import Browser, Page, expect

from evora.storage.jobs import Failure
from tests.dashboard.conftest import Dashboard, login

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


async def test_job_ids_can_be_told_apart_and_copied(dashboard: Dashboard, page: Page) -> None:
    jobs = [await dashboard.submit(queue="ids", type="t", payload={"n": n}) for n in range(3)]
    # UUIDv7: jobs submitted together share their leading (timestamp) characters
    assert len({job["id"][:8] for job in jobs}) == 1
    await page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    await login(page, dashboard.url)
    await page.goto(dashboard.url + "/#/queues/ids")

    shown = []
    for job in jobs:
        link = page.get_by_role("link", name=f"Job {job['id']}")
        await expect(link).to_have_text("…" + job["id"][-12:])
        await expect(link).to_have_attribute("title", job["id"])
        shown.append(await link.text_content())
    assert len(set(shown)) == len(jobs)

    await page.get_by_role("button", name=f"Copy job id {jobs[1]['id']}").click()
    assert await page.evaluate("navigator.clipboard.readText()") == jobs[1]["id"]


async def test_times_have_date_and_zone_and_delayed_jobs_say_when_they_run(
    dashboard: Dashboard, browser: Browser
) -> None:
    delayed = await dashboard.submit(queue="later", type="t", delay_seconds=3600)
    due = await dashboard.submit(queue="later", type="t")
    # a zone with a half-hour offset: the page must say which zone its times are in
    context = await browser.new_context(timezone_id="Asia/Kolkata", locale="en-US")
    try:
        page = await context.new_page()
        await login(page, dashboard.url)
        await page.goto(dashboard.url + "/#/queues/later")
        row = page.locator(f"tr[data-job='{delayed['id']}']")
        # Due in 3,600 s less the time it took to show the page, rounded to the second: "1 h"
        # when that took under half a second, "59 min" after.
        await expect(row.locator(".job-state")).to_contain_text(
            re.compile(r"runs in (59 min|1 h)$")
        )
        await expect(page.locator(f"tr[data-job='{due['id']}'] .runs-in")).to_have_count(0)
        created = row.locator("time").first
        await expect(created).to_have_text(re.compile(f"^{STAMP}\\+05:30$"))
        await expect(created).to_have_attribute("title", re.compile(r"^\d+ s ago \("))

        await page.get_by_role("link", name=f"Job {delayed['id']}").click()
        run_at = page.locator("dt:text-is('Run at') + dd")
        await expect(run_at).to_contain_text(re.compile(f"{STAMP}\\+05:30 \\(runs in 59 min\\)"))
        # relative times carry the full stamp on hover
        updated = page.locator("dt:text-is('Updated') + dd time")
        await expect(updated).to_have_attribute("title", re.compile(f"^{STAMP}\\+05:30$"))
    finally:
        await context.close()


async def test_no_latency_is_a_dash_and_an_empty_dlq_has_no_redrive(
    dashboard: Dashboard, page: Page
) -> None:
    await dashboard.submit(queue="quiet", type="t")  # never claimed: no latency sample
    await dashboard.caught_up()
    await login(page, dashboard.url)
    row = page.locator("#queues-table tr[data-queue='quiet']")
    await expect(row).to_contain_text("wait — · — · —")
    await expect(row).to_contain_text("run — · — · —")
    # (a value and its unit are joined by a no-break space)
    assert "0\u00a0ms" not in (await row.text_content() or "")

    await page.goto(dashboard.url + "/#/queues/quiet")
    await expect(page.get_by_role("heading", name="Queue quiet")).to_be_visible()
    await expect(page.get_by_role("img", name=re.compile("Latency percentiles"))).to_have_attribute(
        "aria-label", re.compile(r"Wait: p50 —, p95 —, p99 —")
    )
    await expect(page.get_by_role("button", name="Pause")).to_be_visible()
    await expect(page.get_by_role("button", name="Redrive DLQ…")).to_have_count(0)

    await dashboard.dead_letter("dead-ends")
    await dashboard.caught_up()
    await page.goto(dashboard.url + "/#/queues/dead-ends")
    await expect(page.get_by_role("button", name="Redrive DLQ…")).to_be_visible()


async def test_charts_show_history_from_before_the_page_was_opened(
    dashboard: Dashboard, page: Page
) -> None:
    for n in range(3):
        await dashboard.submit(queue="past", type="t", payload={"n": n})
    assert await dashboard.complete_all("past") == 3
    await dashboard.dead_letter("past", "gone")
    await dashboard.caught_up()
    await login(page, dashboard.url)  # opened only now

    trend = page.locator("#queues-table tr[data-queue='past'] td.trend")
    await expect(trend.get_by_role("img")).to_have_attribute(
        "aria-label", re.compile(r"over the last hour: 3 in total")
    )
    await expect(trend.locator("polyline")).to_have_count(1)

    await page.get_by_role("link", name="past", exact=True).click()
    figure = page.locator("#throughput-history")
    # (the three may straddle a minute)
    await expect(figure).to_contain_text(
        re.compile(
            r"over the last 24 h: 3 completed \(at most [123] in a minute\), 4 submitted, "
            r"1 failed or dead-lettered"
        )
    )
    await expect(figure.locator("polyline[data-series='completed']")).to_have_count(1)
    latency = page.locator("#latency-history")
    await expect(latency).to_contain_text(re.compile(r"\d+(\.\d)? m?s run"))
    await expect(page.locator("#latency-history [data-series='run']").first).to_be_attached()
    await page.get_by_label("History").select_option("60")
    await expect(figure).to_contain_text("over the last 1 h: 3 completed")


TRACE = (
    "Traceback (most recent call last):\n"
    '  File "shop/orders.py", line 42, in ship\n'
    "    order = orders[order_id]\n"
    "KeyError: 'order'\n"
)


async def test_failures_are_grouped_and_show_their_stack_trace(
    dashboard: Dashboard, page: Page
) -> None:
    for n in (1234, 5678):
        await dashboard.submit(queue="orders", type="ship", max_attempts=1, payload={"n": n})
    jobs = await dashboard.store.claim(worker_id="w", queues=["orders"], max_jobs=2)
    for job, n in zip(jobs, (1234, 5678), strict=True):
        failure = Failure(
            job["id"], job["lease_token"], f"order {n} not found", "LookupError", traceback=TRACE
        )
        await dashboard.store.fail(failure)
    await dashboard.caught_up()
    await login(page, dashboard.url)
    await page.goto(dashboard.url + "/#/queues/orders")

    groups = page.locator("td.failure-reason")
    await expect(groups).to_have_count(1)
    row = page.locator("tr", has=groups)
    await expect(groups.locator(".error-text")).to_have_text("LookupError: order <n> not found")
    await expect(row.locator("td.num")).to_have_text("2")
    await expect(groups.locator(".example")).to_contain_text("latest: order 5678 not found")
    trace = groups.get_by_label("Stack trace of the latest failure")
    await expect(trace).to_be_hidden()
    await groups.get_by_text("Stack trace").click()
    await expect(trace).to_have_text(TRACE)

    await groups.get_by_role("link", name=f"Job {jobs[1]['id']}").click()
    await expect(page.locator("#error-message")).to_have_text("order 5678 not found")
    await expect(page.locator("#error-traceback")).to_have_text(TRACE)
    # In the timeline too the trace is lines of text, not JSON with literal "\n"s.
    await expect(page.locator("#timeline")).not_to_contain_text('"traceback"')
    failed = page.locator("#timeline > li").filter(has_text="Stack trace")
    await expect(failed).to_have_count(1)
    await failed.get_by_text("Stack trace").click()
    await expect(failed.get_by_label(re.compile(r"^Stack trace of event \d+$"))).to_have_text(TRACE)


async def test_bulk_retry_and_discard_in_the_dlq_ask_first(
    dashboard: Dashboard, page: Page
) -> None:
    dead = [await dashboard.dead_letter("bulk-dlq", f"boom {n}") for n in range(3)]
    ids = [job["id"] for job in dead]
    await login(page, dashboard.url)
    await page.get_by_role("link", name="Dead letters").click()
    retry = page.get_by_role("button", name="Retry selected…")
    discard = page.get_by_role("button", name="Discard selected…")
    await expect(retry).to_be_disabled()
    await expect(discard).to_be_disabled()

    for job_id in ids[:2]:
        await page.get_by_label(f"Select job {job_id}").check()
    await expect(page.locator("#selected-count")).to_have_text("2 selected")
    await retry.click()
    dialog = page.get_by_role("dialog", name="Retry 2 jobs?")
    await expect(dialog).to_contain_text(ids[0][-12:])
    await dialog.get_by_role("button", name="Cancel").click()
    assert [(await dashboard.store.get(i))["state"] for i in ids] == ["DLQ"] * 3

    await retry.click()
    await dialog.get_by_role("button", name="Retry").click()
    await expect(page.get_by_role("status")).to_have_text("Retried 2 jobs.")
    assert [(await dashboard.store.get(i))["state"] for i in ids] == ["PENDING", "PENDING", "DLQ"]
    await expect(page.locator("#recent-actions li")).to_have_count(2)
    await expect(page.locator("tr[data-job]")).to_have_count(1)  # refreshed

    await page.get_by_label("Select every job of this page").check()
    await expect(page.locator("#selected-count")).to_have_text("1 selected")
    await discard.click()
    await (
        page.get_by_role("dialog", name="Discard 1 job?")
        .get_by_role("button", name="Discard")
        .click()
    )
    await expect(page.get_by_role("status")).to_have_text("Discarded 1 job.")
    assert (await dashboard.store.get(ids[2]))["state"] == "CANCELLED"
    await expect(page.get_by_text("The dead-letter queue is empty.")).to_be_visible()
