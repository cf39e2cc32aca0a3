// Analytics: the latest `evora pipeline run` per queue (GET /v1/analytics), its totals next
// to the projector's live ones and whether they agree, with the run's retry and DLQ rates
// and latency; before any run, the one command that computes them. Per queue, the same run
// per job type (GET /v1/analytics/queues/{queue}).

import { api, seg, withQuery } from "./api.js";
import { dataTable, h, keysetPager, replace } from "./dom.js";
import { ago, ms, num } from "./format.js";

const PAGE = 50;
const TOTALS = [
  ["submitted", "Submitted"],
  ["completed", "Completed"],
  ["failed", "Failed"],
  ["dead_lettered", "Dead-lettered"],
  ["retried", "Retried"],
  ["lease_expired", "Lease expired"],
];
const RUN_COMMAND = "evora pipeline run";

function percent(value) {
  return value === null || value === undefined ? "—" : `${(100 * value).toFixed(1)} %`;
}

/** "600 / 600": the pipeline's count, then the live one; "—" for a side without the queue. */
function totalCell(pipeline, projector, key) {
  const ours = pipeline ? num(pipeline.totals[key]) : "—";
  const live = projector ? num(projector.totals[key]) : "—";
  const differs = pipeline && projector && pipeline.totals[key] !== projector.totals[key];
  return h("td", { class: `num nowrap${differs ? " analytics-differs" : ""}`, "data-total": key }, `${ours} / ${live}`);
}

function agreeCell(q) {
  let text = "✕ Differ";
  let why = "The totals differ: events after the run (see Live totals at) or a projector rebuild after archiving.";
  if (!q.pipeline) [text, why] = ["Not in the run", "No event of this queue was in the last run: it is newer."];
  else if (!q.projector) [text, why] = ["Not live", "The projector has no totals for this queue (its events were archived before a rebuild)."];
  else if (q.agree) [text, why] = ["✓ Agree", "The pipeline's totals equal the projector's."];
  return h("td", { class: "analytics-agree nowrap" }, h("span", { class: `state ${q.agree ? "state-COMPLETED" : "state-DLQ"}`, title: why }, text));
}

function row(q) {
  const latency = q.latency || {};
  return h(
    "tr",
    { "data-queue": q.queue },
    h("th", { scope: "row" }, h("a", { href: `#/analytics/${seg(q.queue)}`, title: "Per job type" }, q.queue)),
    TOTALS.map(([key]) => totalCell(q.pipeline, q.projector, key)),
    agreeCell(q),
    h("td", { class: "num" }, percent(q.rates && q.rates.retry_rate)),
    h("td", { class: "num" }, percent(q.rates && q.rates.dlq_rate)),
    h("td", { class: "num" }, ms(latency.wait && latency.wait.p95_ms)),
    h("td", { class: "num" }, ms(latency.run && latency.run.p95_ms)),
  );
}

function ranFacts(facts, run) {
  replace(
    facts,
    h("dt", null, "Last run"), h("dd", { id: "analytics-ran" }, run ? ago(run.at) : "never"),
    h("dt", null, "Events counted"), h("dd", null, run ? `${num(run.events)} (seq up to ${num(run.seq)}, ${num(run.archive.events)} from the archive)` : "—"),
  );
}

function never() {
  return h(
    "div",
    { class: "card empty", id: "analytics-never" },
    h("p", null, "The pipeline has not run yet. Compute the analytics with one command, in a terminal where the system runs:"),
    h("pre", null, h("code", null, RUN_COMMAND)),
    h("p", { class: "muted" }, "It needs PySpark and Java: on evora dev, start it with bash scripts/run.sh --with-pipeline. Live totals are shown below meanwhile."),
  );
}

function mountAll(root, params, ctx) {
  const after = params.after || "";
  const stack = (ctx.memory.analytics = after ? ctx.memory.analytics || [] : []);
  const facts = h("dl", { class: "facts", id: "analytics-facts" });
  const list = h("div");
  replace(
    root,
    h("div", { class: "title-row" }, h("h1", null, "Analytics")),
    h("p", { class: "muted" }, "What the batch pipeline (evora pipeline run) counted over the whole history, archive included, next to the projector's live totals (pipeline / live). On the same events they are equal; events after the run make them differ until the next run. Rates and latency are the run's, all job types together."),
    facts,
    list,
  );

  async function refresh() {
    const page = await api(withQuery("/v1/analytics", { limit: PAGE, after }));
    ctx.setAsOf(page.projector_as_of);
    const run = page.as_of;
    ranFacts(facts, run);
    facts.append(h("dt", null, "Live totals at"), h("dd", null, `seq ${num(page.projector_as_of.seq)}`));
    const table = page.queues.length
      ? dataTable({
          table: { id: "analytics-table" },
          caption: "Per-queue totals: pipeline / live",
          heads: ["Queue", ...TOTALS.map(([, label]) => label), "Totals", "Retry rate", "DLQ rate", "Wait p95", "Run p95"],
          rows: page.queues.map(row),
        })
      : h("div", { class: "card empty" }, "No queue has been seen yet.");
    replace(
      list,
      page.ran ? null : never(),
      table,
      keysetPager({ next: page.next, stack, after, label: "Analytics", shown: page.queues.length, go: (to) => ctx.navigate(withQuery("#/analytics", { after: to })) }),
    );
  }

  return { title: "Analytics", refresh };
}

function statesText(jobs) {
  const entries = Object.entries(jobs);
  return entries.length ? entries.map(([state, n]) => `${state} ${num(n)}`).join(", ") : "—";
}

function typeRow(t) {
  const reason = t.failure_reasons[0];
  const failure = reason ? `${reason.error_type ? `${reason.error_type}: ` : ""}${reason.message} (${num(reason.failures)})` : "—";
  return h(
    "tr",
    { "data-type": t.type },
    h("th", { scope: "row", class: "mono" }, t.type === "*" ? "all types" : t.type),
    h("td", { class: "num" }, num(t.rates && t.rates.jobs)),
    h("td", null, statesText(t.jobs)),
    h("td", { class: "num" }, percent(t.rates && t.rates.retry_rate)),
    h("td", { class: "num" }, percent(t.rates && t.rates.dlq_rate)),
    h("td", { class: "num" }, ms(t.latency.wait && t.latency.wait.p95_ms)),
    h("td", { class: "num" }, ms(t.latency.run && t.latency.run.p95_ms)),
    h("td", { class: "analytics-failure" }, failure),
  );
}

function mountQueue(root, params, ctx) {
  const queue = params.queue;
  const after = params.after || "";
  const stackKey = `analytics:${queue}`;
  const stack = (ctx.memory[stackKey] = after ? ctx.memory[stackKey] || [] : []);
  const facts = h("dl", { class: "facts" });
  const list = h("div");
  replace(
    root,
    h("p", null, h("a", { href: "#/analytics" }, "← All queues"), " · ", h("a", { href: `#/queues/${seg(queue)}` }, `Queue ${queue} now`)),
    h("div", { class: "title-row" }, h("h1", null, `Analytics of ${queue}`)),
    h("p", { class: "muted" }, "The latest pipeline run per job type: jobs (by the state after their latest event), the share retried and dead-lettered at least once, wait (submitted to first claim) and run time p95, and the most frequent failure."),
    facts,
    list,
  );

  async function refresh() {
    const page = await api(withQuery(`/v1/analytics/queues/${seg(queue)}`, { limit: PAGE, after }));
    ranFacts(facts, page.as_of);
    let body;
    if (!page.ran) body = never();
    else if (!page.types.length && !after) body = h("div", { class: "card empty" }, `Queue ${queue} had no event in the latest run.`);
    else body = dataTable({
      table: { id: "analytics-types-table" },
      caption: `Job types of ${queue} in the latest run`,
      heads: ["Type", "Jobs", "Jobs by state", "Retry rate", "DLQ rate", "Wait p95", "Run p95", "Top failure"],
      rows: page.types.map(typeRow),
    });
    replace(
      list,
      body,
      keysetPager({ next: page.next, stack, after, label: "Types", shown: page.types.length, go: (to) => ctx.navigate(withQuery(`#/analytics/${seg(queue)}`, { after: to })) }),
    );
  }

  return { title: `Analytics of ${queue}`, refresh };
}

export const analytics = { mount: mountAll };
export const analyticsQueue = { mount: mountQueue };
