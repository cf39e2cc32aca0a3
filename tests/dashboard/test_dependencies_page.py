"""A job's dependencies and dependents on its page, and the WAITING state's colour, in
headless Chromium against the real api and read models."""

from __future__ import annotations

import re
from typing import Any

from playwright.async_api import Page, Request, expect

from evora.protocol.jobs import JobSubmission
from evora.protocol.states import JobState
from tests.dashboard.conftest import Dashboard, login

# graph.js draws at most this many jobs on each side of the page's job
GRAPH_SIDE = 8


async def diamond(dashboard: Dashboard) -> dict[str, dict[str, Any]]:
    """A -> B, C -> D, with A and B completed: C is PENDING (its queue has no worker yet)
    and the join D still WAITING."""
    a = await dashboard.submit(queue="flow", type="extract")
    b = await dashboard.submit(queue="flow", type="transform", depends_on=[a["id"]])
    c = await dashboard.submit(queue="flow-slow", type="enrich", depends_on=[a["id"]])
    d = await dashboard.submit(queue="flow", type="load", depends_on=[b["id"], c["id"]])
    assert [b["state"], c["state"], d["state"]] == ["WAITING"] * 3
    assert await dashboard.complete_all("flow") == 1  # A: only it was claimable
    assert await dashboard.complete_all("flow") == 1  # B, released by A's completion
    return {"a": a, "b": b, "c": c, "d": d}


def node(page: Page, side: str, job_id: str) -> Any:
    return page.locator(f"#dependency-graph .graph-node[data-side='{side}'][data-job='{job_id}']")


async def test_a_joins_page_shows_both_parents_and_their_states(
    dashboard: Dashboard, page: Page
) -> None:
    jobs = await diamond(dashboard)
    await login(page, dashboard.url)
    await page.goto(f"{dashboard.url}/#/jobs/{jobs['d']['id']}")

    await expect(page.locator("main .title-row .state")).to_have_text("WAITING")
    parents = page.locator("#dependency-graph .graph-node[data-side='dependency']")
    await expect(parents).to_have_count(2)
    await expect(node(page, "dependency", jobs["b"]["id"])).to_have_attribute(
        "data-state", "COMPLETED"
    )
    await expect(node(page, "dependency", jobs["c"]["id"])).to_have_attribute(
        "data-state", "PENDING"
    )
    # the state is written in each node, not only coloured
    await expect(node(page, "dependency", jobs["c"]["id"])).to_contain_text("PENDING")
    await expect(node(page, "self", jobs["d"]["id"])).to_contain_text("WAITING")
    await expect(
        page.locator("#dependency-graph .graph-node[data-side='dependent']")
    ).to_have_count(0)
    await expect(page.locator("#graph-summary")).to_have_text(
        "Waits for 2 jobs. No job waits for this one."
    )
    # a met dependency's link is drawn solid, an unmet one dashed
    await expect(page.locator("#dependency-graph .graph-edge.met")).to_have_count(1)
    await expect(page.locator("#dependency-graph .graph-edge")).to_have_count(2)

    # each parent links to its own page, where the join is listed among its dependents
    await page.get_by_role("link", name=f"Dependency {jobs['c']['id']}, PENDING").click()
    await expect(page.get_by_role("heading", level=1)).to_contain_text(jobs["c"]["id"])
    await expect(node(page, "dependent", jobs["d"]["id"])).to_have_attribute(
        "data-state", "WAITING"
    )
    await expect(node(page, "dependency", jobs["a"]["id"])).to_have_attribute(
        "data-state", "COMPLETED"
    )


async def test_a_parents_page_shows_its_dependents(dashboard: Dashboard, page: Page) -> None:
    jobs = await diamond(dashboard)
    await login(page, dashboard.url)
    await page.goto(f"{dashboard.url}/#/jobs/{jobs['a']['id']}")

    children = page.locator("#dependency-graph .graph-node[data-side='dependent']")
    await expect(children).to_have_count(2)
    await expect(node(page, "dependent", jobs["b"]["id"])).to_have_attribute(
        "data-state", "COMPLETED"
    )
    await expect(node(page, "dependent", jobs["c"]["id"])).to_have_attribute(
        "data-state", "PENDING"
    )
    await expect(
        page.locator("#dependency-graph .graph-node[data-side='dependency']")
    ).to_have_count(0)
    await expect(page.locator("#graph-summary")).to_have_text(
        "Waits for no job. 2 jobs wait for this one."
    )
    await node(page, "dependent", jobs["b"]["id"]).click()
    await expect(page.get_by_role("heading", level=1)).to_contain_text(jobs["b"]["id"])
    await expect(node(page, "dependent", jobs["d"]["id"])).to_have_count(1)

    # a job outside any workflow has no graph at all
    alone = await dashboard.submit(queue="flow", type="alone")
    await page.goto(f"{dashboard.url}/#/jobs/{alone['id']}")
    await expect(page.locator("#timeline > li")).to_have_count(1)
    await expect(page.locator("#dependency-graph")).to_have_count(0)


async def test_cancel_a_waiting_job_and_its_dependents_follow(
    dashboard: Dashboard, page: Page
) -> None:
    parent = await dashboard.submit(queue="chain", type="first")
    waiting = await dashboard.submit(queue="chain", type="second", depends_on=[parent["id"]])
    last = await dashboard.submit(queue="chain", type="third", depends_on=[waiting["id"]])
    await login(page, dashboard.url)
    await page.goto(f"{dashboard.url}/#/jobs/{waiting['id']}")
    await expect(page.locator("main .title-row .state")).to_have_text("WAITING")

    await page.get_by_role("button", name="Cancel job…").click()
    dialog = page.get_by_role("dialog", name="Cancel this job?")
    await expect(dialog).to_contain_text("Jobs waiting for it are cancelled too")
    await dialog.get_by_role("button", name="Cancel job").click()
    await expect(page.locator("main .title-row .state")).to_have_text("CANCELLED")
    await expect(node(page, "dependent", last["id"])).to_have_attribute("data-state", "CANCELLED")
    assert (await dashboard.store.get(last["id"]))["state"] == "CANCELLED"
    assert (await dashboard.store.get(parent["id"]))["state"] == "PENDING"

    # a job nobody waits for is cancelled without the warning
    alone = await dashboard.submit(queue="chain", type="alone")
    await page.goto(f"{dashboard.url}/#/jobs/{alone['id']}")
    await expect(page.locator("main .title-row .state")).to_have_text("PENDING")
    await page.get_by_role("button", name="Cancel job…").click()
    await expect(dialog).to_be_visible()
    await expect(dialog).not_to_contain_text("waiting for it")
    await page.keyboard.press("Escape")


async def test_a_thousand_parents_show_a_count_and_the_first_few(
    dashboard: Dashboard, page: Page
) -> None:
    submitted = await dashboard.store.submit_batch(
        [JobSubmission(queue="fan", type="part", payload={"n": n}) for n in range(1_000)]
    )
    parents = [str(s.job["id"]) for s in submitted]
    join = await dashboard.submit(queue="fan-in", type="join", depends_on=parents)
    fan_out = await dashboard.store.submit_batch(
        [
            JobSubmission(queue="fan-out", type="leaf", depends_on=[submitted[0].job["id"]])
            for _ in range(20)
        ]
    )
    assert len(fan_out) == 20
    await login(page, dashboard.url)
    fetched: list[str] = []

    def count(request: Request) -> None:
        if match := re.search(r"/v1/jobs/([0-9a-f-]{36})$", request.url):
            fetched.append(match[1])

    page.on("request", count)
    await page.goto(f"{dashboard.url}/#/jobs/{join['id']}")
    await expect(page.locator("#graph-summary")).to_have_text(
        f"Waits for 1,000 jobs (the first {GRAPH_SIDE} shown). No job waits for this one."
    )
    shown = page.locator("#dependency-graph .graph-node[data-side='dependency']")
    await expect(shown).to_have_count(GRAPH_SIDE)
    await expect(page.locator("#dependency-graph .graph-more")).to_have_text(
        f"+ {1_000 - GRAPH_SIDE:,} more"
    )
    await expect(page.locator("#dependency-graph .graph-head").first).to_have_text(
        "waits for (1,000)"
    )
    # only the drawn parents were fetched (and the join itself), never all 1,000
    assert set(fetched) - {join["id"]} == set(parents[:GRAPH_SIDE])

    # a parent with 21 dependents: the first few and a note that there are more
    await page.goto(f"{dashboard.url}/#/jobs/{parents[0]}")
    await expect(page.locator("#graph-summary")).to_have_text(
        f"Waits for no job. More than {GRAPH_SIDE} jobs wait for this one "
        f"(the first {GRAPH_SIDE} shown)."
    )
    await expect(
        page.locator("#dependency-graph .graph-node[data-side='dependent']")
    ).to_have_count(GRAPH_SIDE)
    # the join, submitted first, comes first
    await expect(node(page, "dependent", join["id"])).to_have_count(1)


async def badge_colours(page: Page) -> dict[str, list[str]]:
    """State -> the computed [text colour, background] of a badge of that state, drawn into
    the page the way format.js draws one."""
    found: dict[str, list[str]] = await page.evaluate(
        """(states) => Object.fromEntries(states.map((state) => {
            const badge = document.createElement("span");
            badge.className = `state state-${state}`;
            document.querySelector("main").appendChild(badge);
            const style = getComputedStyle(badge);
            const colours = [style.color, style.backgroundColor];
            badge.remove();
            return [state, colours];
        }))""",
        [state.value for state in JobState],
    )
    return found


def computed(*properties: str) -> str:
    return f"el => [{', '.join(f'getComputedStyle(el).{p}' for p in properties)}]"


async def test_waiting_has_its_own_colour_everywhere(dashboard: Dashboard, page: Page) -> None:
    parent = await dashboard.submit(queue="paint", type="first")
    waiting = await dashboard.submit(queue="paint", type="second", depends_on=[parent["id"]])
    await dashboard.caught_up()
    await login(page, dashboard.url)

    # a WAITING badge has colours of its own, as every other state's has
    await page.goto(f"{dashboard.url}/#/queues/paint")
    row = page.locator(f"tr[data-job='{waiting['id']}']")
    await expect(row.locator(".job-state .state")).to_have_text("WAITING")
    badges = await badge_colours(page)
    text, back = badges["WAITING"]
    assert back not in ("rgba(0, 0, 0, 0)", "transparent"), badges
    assert [text, back] not in [badges[s] for s in badges if s != "WAITING"], badges
    others = {badges[s][0] for s in badges if s != "WAITING"}
    assert text not in others, badges
    assert await row.locator(".job-state .state").evaluate(computed("color")) == [text]

    # the state tabs: a dot in the state's colour beside each name
    await expect(page.get_by_role("link", name=re.compile(r"^WAITING 1"))).to_be_visible()
    dot = page.locator(".state-tabs .state-dot.state-WAITING")
    assert await dot.evaluate(computed("backgroundColor")) == [text]

    # the queue's chart of jobs by state: half the bar, in the same colour
    part = page.locator("svg.state-chart rect[data-state='WAITING']")
    assert await part.evaluate(computed("fill")) == [text]
    assert await part.get_attribute("width") == "190"

    # the graph on the parent's page: the waiting dependent's node in the same colours
    await page.goto(f"{dashboard.url}/#/jobs/{parent['id']}")
    rect = node(page, "dependent", waiting["id"]).locator("rect")
    await expect(rect).to_have_count(1)
    assert await rect.evaluate(computed("stroke", "fill")) == [text, back]

    # the overview: the Waiting column's head carries the same dot
    await page.goto(dashboard.url + "/#/")
    head = page.locator("#queues-table thead th", has_text="Waiting").locator(".state-dot")
    await expect(head).to_have_count(1)
    assert await head.evaluate(computed("backgroundColor")) == [text]


async def test_overview_counts_sit_under_their_state_heads(
    dashboard: Dashboard, page: Page
) -> None:
    root = await dashboard.submit(queue="columns", type="t")
    for _ in range(3):
        await dashboard.submit(queue="columns", type="t", depends_on=[root["id"]])
    await dashboard.submit(queue="columns", type="t")
    await dashboard.caught_up()
    await login(page, dashboard.url)
    row = page.locator("#queues-table tr[data-queue='columns']")
    await expect(row).to_be_visible()
    by_head: dict[str, str] = await page.evaluate(
        """() => {
            const text = (el) => el.textContent.trim();
            const heads = [...document.querySelectorAll("#queues-table thead th")];
            const row = document.querySelector("#queues-table tr[data-queue='columns']");
            const cells = [...row.children];
            return Object.fromEntries(heads.map((th, i) => [text(th), cells[i] && text(cells[i])]));
        }"""
    )
    await expect(page.locator(".tile", has_text="waiting")).to_have_text("3waiting")
    assert by_head["Waiting"] == "3", by_head
    assert by_head["Pending"] == "2", by_head
    assert by_head["Completed"] == "0", by_head
    assert by_head["Cancelled"] == "0", by_head
