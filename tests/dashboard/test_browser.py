"""The dashboard driven in headless Chromium against the real api and read models."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page, expect

from evora.protocol.jobs import JobSubmission
from evora_services.api.dashboard.routes import CONTENT_SECURITY_POLICY
from tests.dashboard.conftest import PRODUCER_TOKEN, Dashboard, Problems, login

XSS = (
    '<script>window.__evoraPwned = "script"</script>'
    "<img src=x onerror=\"window.__evoraPwned = 'img'\">"
)


async def test_sign_in_with_a_wrong_token_then_the_right_one(
    dashboard: Dashboard, page: Page, shots: Any
) -> None:
    response = await page.goto(dashboard.url + "/")
    assert response is not None and response.status == 200
    token = page.get_by_label("Admin token")
    await expect(token).to_be_focused()

    await token.fill("not-the-token")
    await token.press("Enter")
    error = page.get_by_role("alert").filter(has_text="not accepted")
    await expect(error).to_contain_text("401")
    await expect(token).to_have_attribute("aria-invalid", "true")
    await shots(page, "login")

    # a valid token of another role is told apart from a wrong one
    await token.fill(PRODUCER_TOKEN)
    await token.press("Enter")
    await expect(page.get_by_role("alert").filter(has_text="not an admin token")).to_be_visible()
    assert await page.evaluate("sessionStorage.length") == 0

    await token.fill("dashboard-admin-token")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Queues", level=1)).to_be_visible()
    await expect(page.locator("#as-of")).to_contain_text(re.compile(r"Updated \d\d:\d\d:\d\d"))
    # kept for this tab only, never in a cookie
    assert await page.evaluate("sessionStorage.getItem('evora.admin-token')") == (
        "dashboard-admin-token"
    )
    assert await page.context.cookies() == []

    # a reload keeps the session; signing out forgets the token
    await page.reload()
    await expect(page.get_by_role("heading", name="Queues", level=1)).to_be_visible()
    await page.get_by_role("button", name="Sign out").click()
    await expect(page.get_by_label("Admin token")).to_be_visible()
    assert await page.evaluate("sessionStorage.getItem('evora.admin-token')") is None


async def test_keyboard_only(dashboard: Dashboard, page: Page) -> None:
    await page.goto(dashboard.url + "/")
    await page.keyboard.type("dashboard-admin-token")  # the token field has focus
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name="Queues", level=1)).to_be_focused()
    for _ in range(10):
        await page.keyboard.press("Tab")
        if await page.evaluate("document.activeElement.textContent") == "Dead letters":
            break
    await page.keyboard.press("Enter")
    # a new page moves focus to its heading, so screen readers announce it
    await expect(page.get_by_role("heading", name="Dead-letter queue")).to_be_focused()
    await expect(page.get_by_role("link", name="Dead letters")).to_have_attribute(
        "aria-current", "page"
    )
    # focus is drawn visibly
    await page.keyboard.press("Tab")
    outline = await page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline == "solid"


async def test_overview_shows_a_queue_created_by_submitted_jobs(
    dashboard: Dashboard, page: Page
) -> None:
    await login(page, dashboard.url)
    await expect(page.get_by_text("No queues yet")).to_be_visible()

    for n in range(3):
        await dashboard.submit(queue="emails", type="email.send", payload={"n": n})
    await dashboard.complete_all("emails")
    await dashboard.submit(queue="emails", type="email.send")
    newest = await dashboard.caught_up()

    await page.get_by_role("button", name="Refresh").click()
    row = page.locator("#queues-table tr[data-queue='emails']")
    await expect(row).to_be_visible()
    await expect(row.get_by_role("link", name="emails")).to_be_visible()
    # WAITING, PENDING, RUNNING, SUSPENDED, COMPLETED, DLQ, CANCELLED
    counts = row.locator("td.num")
    await expect(counts.nth(1)).to_have_text("1")
    await expect(counts.nth(4)).to_have_text("3")
    await expect(row).to_contain_text("Active")
    await expect(page.locator("#lag")).to_contain_text(f"event #{newest}")


async def test_overview_lists_every_queue_page_after_page(dashboard: Dashboard, page: Page) -> None:
    # more queues than one page of GET /v1/queues holds (500 at most)
    names = [f"many-{n:03d}" for n in range(520)]
    await dashboard.store.submit_batch([JobSubmission(queue=name, type="t") for name in names])
    await dashboard.caught_up()
    await login(page, dashboard.url)
    await expect(page.locator("#queues-table tr[data-queue]")).to_have_count(len(names))
    await expect(page.locator(f"#queues-table tr[data-queue='{names[-1]}']")).to_be_visible()


async def test_open_a_job_from_its_queue_and_see_its_timeline(
    dashboard: Dashboard, page: Page
) -> None:
    job = await dashboard.submit(queue="reports", type="report.render", payload={"id": 42})
    await dashboard.complete_all("reports", worker_id="worker-7")
    await dashboard.caught_up()
    await login(page, dashboard.url)

    await page.get_by_role("link", name="reports", exact=True).click()
    await expect(page.get_by_role("heading", name="Queue reports")).to_be_visible()
    await page.get_by_role("link", name=f"Job {job['id']}").click()

    await expect(page.get_by_role("heading", level=1)).to_contain_text(job["id"])
    timeline = page.locator("#timeline > li")
    await expect(timeline).to_have_count(3)
    events = [await item.get_attribute("data-event") for item in await timeline.all()]
    assert events == ["submitted", "claimed", "completed"]
    await expect(timeline.nth(1)).to_contain_text("worker worker-7")
    await expect(page.locator("#payload")).to_contain_text('"id": 42')
    await expect(page.locator("#result")).to_contain_text('"ok": true')
    await expect(page.locator("main .title-row .state")).to_have_text("COMPLETED")


async def test_retry_a_dead_lettered_job_and_see_its_state_change(
    dashboard: Dashboard, page: Page
) -> None:
    dead = await dashboard.dead_letter("payments", "card declined", "PaymentError")
    await dashboard.caught_up()
    await login(page, dashboard.url)

    await page.get_by_role("link", name="Dead letters").click()
    row = page.locator(f"tr[data-job='{dead['id']}']")
    await expect(row.locator(".job-state")).to_have_text("DLQ")
    await expect(row).to_contain_text("PaymentError: card declined")
    await row.get_by_role("button", name="Retry").click()

    await expect(row.locator(".job-state")).to_have_text("PENDING")
    recent = page.locator(f"#recent-actions li[data-job='{dead['id']}']")
    await expect(recent).to_contain_text("now PENDING")
    await expect(page.get_by_role("status")).to_contain_text("now PENDING")
    job = await dashboard.store.get(dead["id"])
    assert job["state"] == "PENDING"

    # refreshed, the job has left the DLQ list; what happened to it stays listed
    await page.get_by_role("button", name="Refresh").click()
    await expect(page.get_by_text("The dead-letter queue is empty.")).to_be_visible()
    await expect(recent).to_contain_text("now PENDING")


async def test_discard_asks_first(dashboard: Dashboard, page: Page) -> None:
    dead = await dashboard.dead_letter("payments")
    await login(page, dashboard.url)
    await page.goto(f"{dashboard.url}/#/jobs/{dead['id']}")
    await page.get_by_role("button", name="Discard…").click()
    dialog = page.get_by_role("dialog", name="Discard this job?")
    await expect(dialog).to_be_visible()
    await page.keyboard.press("Escape")  # cancelling changes nothing
    await expect(dialog).to_have_count(0)
    assert (await dashboard.store.get(dead["id"]))["state"] == "DLQ"
    await page.get_by_role("button", name="Discard…").click()
    await dialog.get_by_role("button", name="Discard").click()
    await expect(page.locator("main .title-row .state")).to_have_text("CANCELLED")
    assert (await dashboard.store.get(dead["id"]))["state"] == "CANCELLED"


async def test_pause_resume_and_redrive_a_queue(dashboard: Dashboard, page: Page) -> None:
    for _ in range(2):
        await dashboard.dead_letter("thumbnails", "image too large", type="image.resize")
    await dashboard.caught_up()
    await login(page, dashboard.url)
    await page.goto(dashboard.url + "/#/queues/thumbnails")
    heading = page.get_by_role("heading", name="Queue thumbnails")
    await expect(heading).to_be_visible()
    badge = page.locator("main .title-row .state")
    await expect(badge).to_have_text("▶ Active")

    await page.get_by_role("button", name="Pause").click()
    await expect(badge).to_have_text("‖ Paused")
    await expect(page.get_by_role("status")).to_contain_text("paused")
    assert await dashboard.store.paused(["thumbnails"]) == {"thumbnails"}
    # focus moved to the button that undoes it, so the keyboard can resume at once
    await expect(page.get_by_role("button", name="Resume")).to_be_focused()
    await page.keyboard.press("Enter")
    await expect(badge).to_have_text("▶ Active")
    assert await dashboard.store.paused(["thumbnails"]) == set()

    # redrive asks first; cancelling moves nothing
    await page.get_by_role("button", name="Redrive DLQ…").click()
    dialog = page.get_by_role("dialog", name="Redrive queue thumbnails?")
    await expect(dialog).to_contain_text("2 dead-lettered jobs")
    await dialog.get_by_role("button", name="Cancel").click()
    assert await _states(dashboard, "thumbnails") == {"DLQ": 2}
    await page.get_by_role("button", name="Redrive DLQ…").click()
    await dialog.get_by_role("button", name="Redrive").click()
    await expect(page.get_by_role("status")).to_contain_text("Redrove 2 jobs")
    assert await _states(dashboard, "thumbnails") == {"PENDING": 2}


async def _states(dashboard: Dashboard, queue: str) -> dict[str, int]:
    rows = await dashboard.pool.fetch(
        "SELECT state::text, count(*) AS n FROM evora.jobs WHERE queue = $1 GROUP BY 1", queue
    )
    return {r["state"]: r["n"] for r in rows}


async def test_queue_jobs_by_state_type_and_keyset_pages(dashboard: Dashboard, page: Page) -> None:
    submitted = [
        await dashboard.submit(queue="bulk", type="a" if n % 3 else "b", payload={"n": n})
        for n in range(30)
    ]
    await dashboard.caught_up()
    await login(page, dashboard.url)
    await page.goto(dashboard.url + "/#/queues/bulk")
    rows = page.locator(".jobs-table tbody tr")
    await expect(rows).to_have_count(25)
    newest_first = [j["id"] for j in reversed(submitted)]
    assert await rows.first.get_attribute("data-job") == newest_first[0]

    await page.get_by_role("button", name="Older →").click()
    await expect(rows).to_have_count(5)
    assert await rows.first.get_attribute("data-job") == newest_first[25]
    await expect(page.get_by_role("button", name="Older →")).to_be_disabled()
    await page.get_by_role("button", name="← Newer").click()
    await expect(rows).to_have_count(25)
    assert await rows.first.get_attribute("data-job") == newest_first[0]

    await page.get_by_label("Type").fill("b")
    await page.get_by_label("State", exact=True).select_option("PENDING")
    await page.get_by_role("button", name="Apply").click()
    await expect(rows).to_have_count(10)
    for row in await rows.all():
        await expect(row.locator("td.mono")).to_have_text("b")
    assert "type=b" in page.url and "state=PENDING" in page.url
    await page.get_by_role("link", name=re.compile(r"^COMPLETED")).click()
    await expect(page.get_by_text("No jobs match these filters.")).to_be_visible()


async def test_attacker_controlled_text_renders_as_text(dashboard: Dashboard, page: Page) -> None:
    job = await dashboard.dead_letter(
        "inbox",
        message=XSS,
        error_type="<b>Bold</b>",
        worker_id='<img src=x onerror="window.__evoraPwned = 1">',
        type="mail.parse",
        payload={"html": XSS},
    )
    await dashboard.caught_up()
    await login(page, dashboard.url)

    await page.goto(f"{dashboard.url}/#/jobs/{job['id']}")
    payload = page.locator("#payload")
    await expect(payload).to_contain_text("<script>window.__evoraPwned")
    await expect(page.locator("#error-message")).to_have_text(XSS)
    await expect(page.get_by_text("<b>Bold</b>", exact=True)).to_be_visible()
    await expect(page.locator("#timeline")).to_contain_text("worker <img src=x onerror=")
    await page.goto(f"{dashboard.url}/#/dlq")
    await expect(page.locator(f"tr[data-job='{job['id']}'] .error-text")).to_have_text(
        f"<b>Bold</b>: {XSS}"
    )
    await page.goto(f"{dashboard.url}/#/queues/inbox")
    await expect(page.get_by_text(f"<b>Bold</b>: {XSS}").first).to_be_visible()

    assert await page.evaluate("window.__evoraPwned") is None
    # no element was made from the strings: no <script> or <img> anywhere in the page
    assert await page.locator("main script, main img, main b").count() == 0


async def test_every_page_is_served_with_a_strict_csp(
    dashboard: Dashboard, page: Page, problems: Problems
) -> None:
    response = await page.goto(dashboard.url + "/")
    assert response is not None
    headers = await response.all_headers()
    assert headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "'unsafe-inline'" not in CONTENT_SECURITY_POLICY
    assert "'unsafe-eval'" not in CONTENT_SECURITY_POLICY
    assert headers["x-content-type-options"] == "nosniff"
    # the browser enforces it: inline script and eval are refused
    ran = await page.evaluate(
        """() => {
            const attempt = (f) => { try { f(); } catch (e) { /* refused */ } };
            attempt(() => setTimeout('window.__evoraEval = 1', 0));
            attempt(() => document.body.insertAdjacentHTML('beforeend', '<i id=evora-html>'));
            attempt(() => {
                const s = document.createElement('script');
                s.textContent = 'window.__evoraInline = 1';
                document.head.appendChild(s);
            });
            attempt(() => {
                const b = document.createElement('button');
                b.setAttribute('onclick', 'window.__evoraHandler = 1');
                document.body.appendChild(b);
                b.click();
            });
            return new Promise((resolve) => setTimeout(() => resolve(
                [window.__evoraEval, window.__evoraInline, window.__evoraHandler,
                 document.getElementById('evora-html')]), 50));
        }"""
    )
    assert ran == [None, None, None, None]
    # (page.evaluate itself runs outside the page's CSP, so it cannot try eval; the
    # policy has no 'unsafe-eval', checked above.) An inline <script> tag is refused too:
    with pytest.raises(PlaywrightError):
        await page.add_script_tag(content="window.__evoraTag = 1")
    assert await page.evaluate("window.__evoraTag") is None
    # the refusals were reported (and are the only problems of this page)
    assert problems.messages
    assert all(re.search("Content Security Policy|Trusted", m) for m in problems.messages)
    problems.messages.clear()
    # every script and style the page loaded came from this origin
    loaded: list[Any] = await page.evaluate(
        "performance.getEntriesByType('resource').map(e => e.name)"
    )
    assert loaded and all(url.startswith(dashboard.url + "/") for url in loaded)


@pytest.mark.parametrize("width", [1400, 1024])
async def test_the_overview_fits_the_window(dashboard: Dashboard, page: Page, width: int) -> None:
    """Every column of the queues table is in view, with no sideways scrolling, on a laptop's
    window and a small one."""
    await dashboard.submit(queue="a-rather-long-queue-name-for-layout", type="t")
    await dashboard.complete_all("a-rather-long-queue-name-for-layout")
    await dashboard.caught_up()
    await page.set_viewport_size({"width": width, "height": 900})
    await login(page, dashboard.url)
    table = page.locator("table").first
    await expect(table.locator("tbody tr")).to_have_count(1)
    overflow = await table.evaluate(
        """t => {
          const wrap = t.closest('.table-wrap') || t.parentElement;
          const last = t.querySelector('thead th:last-child').getBoundingClientRect();
          return {scroll: wrap.scrollWidth - wrap.clientWidth,
                  right: Math.ceil(last.right) - document.documentElement.clientWidth};
        }"""
    )
    widths = await table.evaluate(
        "t => [...t.querySelectorAll('thead th')]"
        ".map(th => th.textContent + ': ' + Math.round(th.getBoundingClientRect().width))"
    )
    assert overflow["scroll"] <= 0 and overflow["right"] <= 0, (overflow, widths)
