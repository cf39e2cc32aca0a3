// One queue: stats and charts, pause/resume, DLQ redrive (after a confirmation), failure
// reasons, and its jobs by state and type, a keyset page at a time.

import { api, ApiError, seg, withQuery } from "./api.js";
import { historyPoints, latencyChart, lineChart, stateChart, throughputChart } from "./charts.js";
import { confirmDialog, dataTable, h, replace } from "./dom.js";
import { ago, jobIdCell, ms, num, pausedBadge, rate, runsIn, shortId, stateBadge, stateLabel, STATES, time } from "./format.js";

const PAGE_SIZES = ["25", "50", "100"];
// How far back the history charts look, in minutes (the api keeps 24 h).
const RANGES = { 60: "1 h", 360: "6 h", 1440: "24 h" };
const DEFAULT_RANGE = "1440";

export function hashFor(queue, { state = "", type = "", after = "", limit = "" } = {}) {
  return withQuery(`#/queues/${seg(queue)}`, { state, type, after, limit });
}

export function jobRow(job, { showQueue = false } = {}) {
  const error = job.last_error;
  return h(
    "tr",
    { "data-job": job.id },
    h("th", { scope: "row" }, jobIdCell(job.id, `job:${job.id}`)),
    showQueue ? h("td", null, h("a", { href: `#/queues/${seg(job.queue)}` }, job.queue)) : null,
    h("td", { class: "mono" }, job.type),
    h("td", { class: "job-state" }, stateBadge(job.state), runsIn(job) && [" ", runsIn(job)]),
    h("td", { class: "num" }, `${job.attempt} / ${job.max_attempts}`),
    h("td", { class: "num" }, String(job.priority)),
    h("td", { class: "nowrap" }, time(job.created_at)),
    h("td", { class: "nowrap" }, ago(job.updated_at)),
    h("td", { class: "error-text" }, error ? `${error.type ? `${error.type}: ` : ""}${error.message}` : ""),
  );
}

export function jobsTable(jobs, { caption, showQueue = false, leadHead = null, extraHead = null, row = jobRow }) {
  return dataTable({
    table: { class: "jobs-table" },
    caption,
    showCaption: true,
    heads: [
      leadHead,
      "Job",
      showQueue ? "Queue" : null,
      "Type",
      "State",
      h("th", { scope: "col", class: "num" }, "Attempt"),
      h("th", { scope: "col", class: "num" }, "Priority"),
      "Created",
      "Updated",
      "Last error",
      extraHead,
    ],
    rows: jobs.map((job) => row(job, { showQueue })),
  });
}

/**
 * Keyset pagination controls. `stack` holds the `after` of every page before this one,
 * so "Newer" can go back; go(after) navigates.
 */
export function pager({ page, stack, after, go, label }) {
  const newer = h("button", { type: "button", "data-focus-key": `${label}:newer`, disabled: !after }, "← Newer");
  const older = h("button", { type: "button", "data-focus-key": `${label}:older`, disabled: !page.next }, "Older →");
  newer.addEventListener("click", () => go(stack.length ? stack.pop() : "", false));
  older.addEventListener("click", () => {
    stack.push(after || "");
    go(page.next, true);
  });
  const where = after ? `Page ${stack.length + 1}` : "Page 1 (newest)";
  return h("nav", { class: "pager", "aria-label": `${label} pages` }, newer, h("span", { class: "muted" }, `${where} · ${page.jobs.length} shown`), older);
}

/** A failure group: its normalised message, then the latest example, its job and its
 * stack trace (folded). */
function failureReason(r) {
  return [
    h("div", { class: "error-text" }, `${r.type ? `${r.type}: ` : ""}${r.message}`),
    r.example !== r.message || r.job_id
      ? h(
          "div",
          { class: "muted example" },
          "latest: ",
          h("span", { class: "example-text" }, r.example),
          r.job_id ? [" (", h("a", { href: `#/jobs/${seg(r.job_id)}`, class: "mono", title: r.job_id, "aria-label": `Job ${r.job_id}` }, shortId(r.job_id)), ")"] : null,
        )
      : null,
    r.traceback
      ? h("details", { class: "traceback" }, h("summary", null, "Stack trace"), h("pre", { class: "json", tabindex: "0", "aria-label": "Stack trace of the latest failure" }, r.traceback))
      : null,
  ];
}

export function mount(root, params, ctx) {
  const queue = params.queue;
  const state = STATES.includes(params.state) ? params.state : "";
  const type = params.type || "";
  const after = params.after || "";
  const limit = PAGE_SIZES.includes(params.limit) ? params.limit : "25";
  const stackKey = `queue:${queue}:${state}:${type}:${limit}`;
  const stack = (ctx.memory[stackKey] = after ? ctx.memory[stackKey] || [] : []);

  let stats = null;
  let history = null;
  const range = () => (RANGES[ctx.memory.historyMinutes] ? ctx.memory.historyMinutes : DEFAULT_RANGE);
  const rangeSelect = h(
    "select",
    { id: "history-range", "data-focus-key": "history-range" },
    Object.entries(RANGES).map(([minutes, text]) => h("option", { value: minutes, selected: minutes === range() }, `last ${text}`)),
  );
  rangeSelect.addEventListener("change", () => {
    ctx.memory.historyMinutes = rangeSelect.value;
    ctx.refreshNow();
  });
  const badge = h("span");
  const pauseButton = h("button", { type: "button", "data-focus-key": "pause" }, "Pause");
  const resumeButton = h("button", { type: "button", "data-focus-key": "resume" }, "Resume");
  const redriveButton = h("button", { type: "button", class: "danger", "data-focus-key": "redrive" }, "Redrive DLQ…");
  const tabs = h("ul", { class: "state-tabs" });
  const charts = h("div", { class: "grid" });
  const failures = h("div");
  const jobs = h("div");

  const typeInput = h("input", { id: "filter-type", name: "type", value: type, placeholder: "any type", autocomplete: "off", spellcheck: "false", "data-focus-key": "filter-type" });
  const stateSelect = h(
    "select",
    { id: "filter-state", name: "state", "data-focus-key": "filter-state" },
    h("option", { value: "" }, "Any state"),
    STATES.map((s) => h("option", { value: s, selected: s === state }, s)),
  );
  const limitSelect = h(
    "select",
    { id: "filter-limit", name: "limit", "data-focus-key": "filter-limit" },
    PAGE_SIZES.map((n) => h("option", { value: n, selected: n === limit }, n)),
  );
  const filterForm = h(
    "form",
    { class: "filters", "aria-label": "Filter jobs" },
    h("div", { class: "field" }, h("label", { for: "filter-state" }, "State"), stateSelect),
    h("div", { class: "field" }, h("label", { for: "filter-type" }, "Type"), typeInput),
    h("div", { class: "field" }, h("label", { for: "filter-limit" }, "Per page"), limitSelect),
    h("button", { type: "submit", class: "primary", "data-focus-key": "filter-apply" }, "Apply"),
    h("button", { type: "button", "data-focus-key": "filter-clear", onclick: () => ctx.navigate(hashFor(queue)) }, "Clear filters"),
  );
  filterForm.addEventListener("submit", (event) => {
    event.preventDefault();
    ctx.navigate(hashFor(queue, { state: stateSelect.value, type: typeInput.value.trim(), limit: limitSelect.value === "25" ? "" : limitSelect.value }));
  });

  replace(
    root,
    h("p", { class: "muted" }, h("a", { href: "#/" }, "Queues"), " / ", queue),
    h(
      "div",
      { class: "title-row" },
      h("h1", null, "Queue ", h("span", { class: "mono" }, queue)),
      badge,
      h("div", { class: "actions" }, pauseButton, resumeButton, redriveButton),
    ),
    h("nav", { "aria-label": "Jobs by state" }, tabs),
    h("div", { class: "filters" }, h("div", { class: "field" }, h("label", { for: "history-range" }, "History"), rangeSelect)),
    charts,
    failures,
    h("h2", null, "Jobs"),
    filterForm,
    jobs,
  );

  async function act(button, run) {
    button.disabled = true;
    try {
      await run();
    } catch (error) {
      if (!(error instanceof ApiError && error.status === 401)) ctx.announce(`Failed: ${ctx.describe(error)}`, { error: true });
    } finally {
      button.disabled = false;
      await ctx.refreshNow();
    }
  }

  pauseButton.addEventListener("click", () =>
    act(pauseButton, async () => {
      await api(`/v1/queues/${seg(queue)}/pause`, { method: "POST" });
      ctx.announce(`Queue ${queue} paused: workers claim nothing from it until it is resumed.`);
    }).then(() => (resumeButton.hidden ? pauseButton : resumeButton).focus()),
  );
  resumeButton.addEventListener("click", () =>
    act(resumeButton, async () => {
      await api(`/v1/queues/${seg(queue)}/resume`, { method: "POST" });
      ctx.announce(`Queue ${queue} resumed.`);
    }).then(() => (pauseButton.hidden ? resumeButton : pauseButton).focus()),
  );
  redriveButton.addEventListener("click", async () => {
    const known = stats ? stats.counts.DLQ : null;
    const what = type ? `the dead-lettered jobs of type “${type}”` : "all dead-lettered jobs";
    const ok = await confirmDialog({
      title: `Redrive queue ${queue}?`,
      body: [
        `This moves ${what} of queue “${queue}” back to PENDING with a fresh attempt budget; workers will run them again.`,
        known === null ? "" : `The read models count ${num(known)} dead-lettered jobs in this queue.`,
      ].filter(Boolean),
      confirm: "Redrive",
      danger: true,
    });
    if (!ok) {
      redriveButton.focus();
      return;
    }
    await act(redriveButton, async () => {
      const { redriven } = await api(`/v1/queues/${seg(queue)}/redrive`, { method: "POST", body: type ? { type } : {} });
      ctx.announce(`Redrove ${num(redriven)} job${redriven === 1 ? "" : "s"} of ${queue} back to PENDING.`);
    });
    redriveButton.focus();
  });

  const legend = (...names) =>
    h("p", { class: "legend" }, names.map((name, i) => h("span", null, h("span", { class: `swatch swatch-${i + 1}` }), name)));
  const sum = (values) => values.reduce((n, v) => n + (v || 0), 0);

  // Charts of the per-minute history the read models keep (GET /v1/stats/queues/{queue}/history).
  const historyCharts = {
    throughput() {
      if (!history) return null;
      const span = RANGES[range()];
      const failed = history.failed.map((n, i) => n + history.dead_lettered[i]);
      const peak = Math.max(0, ...history.completed);
      const label = `Jobs per minute over the last ${span}: ${num(sum(history.completed))} completed (at most ${num(peak)} in a minute), ${num(sum(history.submitted))} submitted, ${num(sum(failed))} failed or dead-lettered`;
      return h(
        "figure",
        { id: "throughput-history" },
        lineChart(
          [
            { name: "completed", points: historyPoints(history, "completed") },
            { name: "submitted", points: historyPoints(history, "submitted") },
            { name: "failed", points: historyPoints({ ...history, failed }, "failed") },
          ],
          { label, format: (v) => `${num(v)}/min` },
        ),
        h("figcaption", null, legend("completed", "submitted", "failed or dead-lettered"), h("span", { class: "muted" }, `${label}.`)),
      );
    },
    latency() {
      if (!history) return null;
      const measured = (values) => values.filter((v) => v !== null);
      const worst = (values) => (measured(values).length ? ms(Math.max(...measured(values))) : "—");
      const label = `Mean wait and run time per minute over the last ${RANGES[range()]}: worst minute ${worst(history.wait_ms)} wait, ${worst(history.run_ms)} run`;
      return h(
        "figure",
        { id: "latency-history" },
        lineChart(
          [
            { name: "wait", points: historyPoints(history, "wait_ms") },
            { name: "run", points: historyPoints(history, "run_ms") },
          ],
          { label, format: ms },
        ),
        h("figcaption", { class: "muted" }, `${label}.`),
      );
    },
  };

  function renderStats() {
    const total = stats ? STATES.reduce((n, s) => n + (stats.counts[s] || 0), 0) : null;
    const tab = (label, value, count) =>
      h(
        "li",
        null,
        h(
          "a",
          { href: hashFor(queue, { state: value, type }), "aria-current": value === state ? "true" : "false", "data-focus-key": `tab:${value}` },
          label,
          count === null ? null : [" ", h("span", { class: "n" }, num(count))],
        ),
      );
    replace(tabs, tab("All", "", total), STATES.map((s) => tab(stateLabel(s), s, stats ? stats.counts[s] : null)));
    if (!stats) {
      replace(badge);
      pauseButton.hidden = false;
      resumeButton.hidden = false;
      redriveButton.hidden = true;
      replace(charts, h("div", { class: "card muted" }, "No stats for this queue yet: the read models have not seen it (the projector may still be catching up)."));
      return;
    }
    replace(badge, pausedBadge(stats.paused));
    pauseButton.hidden = stats.paused;
    resumeButton.hidden = !stats.paused;
    // nothing to redrive: no button to press by mistake during an incident
    redriveButton.hidden = !stats.counts.DLQ;
    const cpm = stats.throughput.completed_per_minute;
    replace(
      charts,
      h(
        "section",
        { class: "card", "aria-labelledby": "states-title throughput-title" },
        h("h2", { id: "states-title" }, "Jobs by state"),
        stateChart(stats.counts),
        h("p", { class: "legend" }, STATES.map((s) => h("span", null, stateLabel(s, `${s} ${num(stats.counts[s] || 0)}`)))),
        h("h2", { id: "throughput-title" }, "Throughput"),
        throughputChart(cpm),
        h("p", { class: "muted" }, `Completed per minute: ${rate(cpm["1m"])} (1 min), ${rate(cpm["5m"])} (5 min), ${rate(cpm["15m"])} (15 min). Totals: ${num(stats.totals.submitted)} submitted, ${num(stats.totals.completed)} completed, ${num(stats.totals.failed)} failed attempts, ${num(stats.totals.dead_lettered)} dead-lettered, ${num(stats.totals.retried)} retried, ${num(stats.totals.lease_expired)} leases expired.`),
        historyCharts.throughput(),
      ),
      h(
        "section",
        { class: "card", "aria-labelledby": "latency-title" },
        h("h2", { id: "latency-title" }, "Latency"),
        latencyChart(stats.latency_ms),
        h("p", { class: "legend" }, h("span", null, h("span", { class: "swatch swatch-1" }), "wait (due → claimed)"), h("span", null, h("span", { class: "swatch swatch-2" }), "run (claimed → finished)")),
        h("p", { class: "muted" }, "Oldest pending job: ", stats.oldest_pending_at ? ago(stats.oldest_pending_at) : "—", "."),
        historyCharts.latency(),
      ),
    );
  }

  function renderFailures(types) {
    if (!types.length) {
      replace(failures);
      return;
    }
    const rows = types.flatMap((t) =>
      t.reasons.slice(0, 3).map((r, i) =>
        h(
          "tr",
          null,
          i === 0 ? h("th", { scope: "row", class: "mono", rowspan: String(Math.min(3, t.reasons.length)) }, t.type, h("div", { class: "muted" }, `${num(t.failures)} failures`)) : null,
          h("td", { class: "failure-reason" }, failureReason(r)),
          h("td", { class: "num" }, num(r.count)),
          h("td", { class: "nowrap" }, ago(r.last_at)),
        ),
      ),
    );
    replace(
      failures,
      h("h2", null, "Most frequent failures"),
      dataTable({
        caption: "Most frequent failure reasons per job type",
        heads: ["Type", "Error", h("th", { scope: "col", class: "num" }, "Count"), "Last seen"],
        rows,
      }),
    );
  }

  async function refresh() {
    const statsCall = api(`/v1/queues/${seg(queue)}/stats`).catch((error) => {
      if (error instanceof ApiError && error.status === 404) return null;
      throw error;
    });
    const historyCall = api(withQuery(`/v1/stats/queues/${seg(queue)}/history`, { minutes: range() })).catch((error) => {
      if (error instanceof ApiError && error.status === 404) return null;
      throw error;
    });
    const failuresCall = api(`/v1/queues/${seg(queue)}/failures`);
    const pageCall = api(withQuery("/v1/jobs", { queue, state, type, limit, after }));
    const [found, past, failed, page] = await Promise.all([statsCall, historyCall, failuresCall, pageCall]);
    stats = found;
    history = past;
    if (stats) ctx.setAsOf(stats.as_of);
    renderStats();
    renderFailures(failed.types);
    const caption = `${state ? `${state} jobs` : "Jobs"}${type ? ` of type ${type}` : ""}, newest first`;
    replace(
      jobs,
      page.jobs.length
        ? jobsTable(page.jobs, { caption })
        : h("div", { class: "card empty" }, after ? "No more jobs." : "No jobs match these filters."),
      pager({
        page,
        stack,
        after,
        label: "Jobs",
        go: (next) => ctx.navigate(hashFor(queue, { state, type, after: next, limit: limit === "25" ? "" : limit })),
      }),
    );
  }

  return { title: `Queue ${queue}`, refresh };
}
