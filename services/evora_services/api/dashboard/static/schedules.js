// Schedules (periodic jobs): next and last run, the last job, and pause / resume / trigger.

import { api, apiAll, seg } from "./api.js";
import { dataTable, h, replace } from "./dom.js";
import { ago, pausedBadge, shortId } from "./format.js";

function jobLink(id) {
  if (!id) return h("span", { class: "muted" }, "—");
  return h("a", { href: `#/jobs/${seg(id)}`, class: "mono", title: id, "aria-label": `Job ${id}` }, shortId(id));
}

// A schedule whose last steps made no job (its submission was refused): how many in a row,
// and the error, so the operator sees why without the logs.
function failingBadge(s) {
  if (!s.consecutive_failures) return null;
  const since = `failing since ${ago(s.failing_since)}`;
  return h(
    "span",
    { class: "schedule-failing" },
    " ",
    h("span", { class: "state state-failing", title: `${since}: ${s.last_error.message}` }, `✕ Failing: ${s.consecutive_failures} in a row`),
    h("span", { class: "muted schedule-error" }, ` ${s.last_error.message}`),
  );
}

export function mount(root, params, ctx) {
  const list = h("div");
  replace(
    root,
    h("div", { class: "title-row" }, h("h1", null, "Schedules")),
    h("p", { class: "muted" }, "Periodic jobs: each tick of a schedule's cron expression, read in its time zone, makes exactly one job. A paused schedule makes none; trigger makes one now, outside the ticks."),
    list,
  );

  async function act(button, schedule, verb) {
    button.disabled = true;
    try {
      const answer = await api(`/v1/schedules/${seg(schedule.name)}/${verb}`, { method: "POST" });
      const made = verb === "trigger" ? ` Job ${shortId(answer.id)} submitted.` : "";
      ctx.announce(`Schedule ${schedule.name}: ${verb === "trigger" ? "triggered" : `${verb}d`}.${made}`);
      await ctx.refreshNow();
    } catch (error) {
      ctx.announce(`Could not ${verb} schedule ${schedule.name}: ${ctx.describe(error)}`, { error: true });
      button.disabled = false;
    }
  }

  function row(s) {
    const toggle = s.paused ? "resume" : "pause";
    const key = `schedule-${s.name}`;
    const toggleButton = h("button", { type: "button", "data-focus-key": `${key}-${toggle}`, "aria-label": `${s.paused ? "Resume" : "Pause"} schedule ${s.name}` }, s.paused ? "Resume" : "Pause");
    toggleButton.addEventListener("click", () => act(toggleButton, s, toggle));
    const triggerButton = h("button", { type: "button", "data-focus-key": `${key}-trigger`, "aria-label": `Trigger schedule ${s.name} now` }, "Trigger");
    triggerButton.addEventListener("click", () => act(triggerButton, s, "trigger"));
    return h(
      "tr",
      { "data-schedule": s.name },
      h("th", { scope: "row", class: "mono" }, s.name),
      h("td", { class: "mono" }, s.cron),
      h("td", null, s.timezone),
      h("td", null, h("a", { href: `#/queues/${seg(s.job.queue)}` }, s.job.queue), " / ", s.job.type),
      h("td", null, s.misfire),
      h("td", { class: "schedule-state" }, pausedBadge(s.paused), failingBadge(s)),
      h("td", { class: "nowrap" }, ago(s.next_run_at)),
      h("td", { class: "nowrap" }, ago(s.last_run_at)),
      h("td", null, jobLink(s.last_job_id)),
      h("td", { class: "actions nowrap" }, toggleButton, " ", triggerButton),
    );
  }

  async function refresh() {
    const schedules = await apiAll("/v1/schedules", "schedules");
    if (!schedules.length) {
      replace(list, h("div", { class: "card empty" }, "No schedules yet. Create one with PUT /v1/schedules/{name} (docs/schedules.md)."));
      return;
    }
    replace(
      list,
      dataTable({
        table: { id: "schedules-table" },
        caption: "Schedules",
        heads: ["Schedule", "Cron", "Time zone", "Queue / type", "Misfire", "Status", "Next run", "Last run", "Last job", "Actions"],
        rows: schedules.map(row),
      }),
    );
  }

  return { title: "Schedules", refresh };
}
