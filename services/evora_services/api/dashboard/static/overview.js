// Queues overview: every queue's counts per state, throughput, latency, paused flag, and
// how far behind the read models are.

import { apiAll, seg } from "./api.js";
import { historyPoints, sparkline } from "./charts.js";
import { dataTable, h, replace } from "./dom.js";
import { ago, countCell, ms, num, pausedBadge, rate, span, secondsSince, stateLabel, STATE_TITLES, STATES } from "./format.js";

// The Trend column: completions per minute over the last hour.
const TREND_MINUTES = 60;

function tile(value, label, extra) {
  return h("div", { class: "tile" }, h("span", { class: "value" }, value), h("span", { class: "label" }, label), extra);
}

function latencyText(p) {
  // A value and its unit stay on one line when a narrow window wraps the cell.
  return [p.p50, p.p95, p.p99].map((v) => ms(v).replace(" ", "\u00a0")).join(" · ");
}

function trendCell(q, history) {
  if (!history) return h("td", { class: "muted" }, "—");
  const values = historyPoints(history, "completed").map((p) => p.v);
  const total = values.reduce((n, v) => n + v, 0);
  const peak = Math.max(0, ...values);
  return h(
    "td",
    { class: "trend", title: `${num(total)} completed in the last hour, at most ${num(peak)} in a minute` },
    sparkline(values, `Completed per minute of ${q.queue} over the last hour: ${num(total)} in total, at most ${num(peak)} in a minute`),
  );
}

function queueRow(q, history) {
  const link = h("a", { href: `#/queues/${seg(q.queue)}`, "data-focus-key": `queue:${q.queue}` }, q.queue);
  // one cell per state, in the order of the column heads (both from STATES)
  const count = (state) =>
    state === "DLQ" && q.counts.DLQ
      ? h("td", { class: "num" }, h("a", { href: `#/queues/${seg(q.queue)}?state=DLQ`, "aria-label": `${q.counts.DLQ} dead-lettered jobs in ${q.queue}` }, num(q.counts.DLQ)))
      : countCell(q.counts[state] || 0);
  const oldest = q.oldest_pending_at ? ago(q.oldest_pending_at) : h("span", { class: "muted" }, "—");
  return h(
    "tr",
    { "data-queue": q.queue },
    h("th", { scope: "row" }, link),
    h("td", null, pausedBadge(q.paused)),
    STATES.map(count),
    h("td", { class: "num nowrap" }, `${rate(q.throughput.completed_per_minute["1m"])} · ${rate(q.throughput.completed_per_minute["5m"])} · ${rate(q.throughput.completed_per_minute["15m"])}`),
    trendCell(q, history),
    h(
      "td",
      { class: "num latency" },
      h("div", null, h("span", { class: "muted" }, "wait "), latencyText(q.latency_ms.wait)),
      h("div", null, h("span", { class: "muted" }, "run "), latencyText(q.latency_ms.run)),
    ),
    h("td", { class: "nowrap" }, oldest),
  );
}

export function mount(root, params, ctx) {
  const tiles = h("div", { class: "tiles" });
  const table = h("div");
  replace(
    root,
    h("div", { class: "title-row" }, h("h1", null, "Queues")),
    h("p", { class: "muted" }, "Counts and rates come from the read models (eventually consistent); paused flags come from PostgreSQL."),
    tiles,
    table,
  );

  async function refresh() {
    const [queues, histories] = await Promise.all([
      apiAll("/v1/queues", "queues"),
      apiAll("/v1/stats/history", "history", { minutes: TREND_MINUTES }),
    ]);
    const historyOf = new Map(histories.map((history) => [history.queue, history]));
    const asOf = queues.length ? queues[0].as_of : null;
    ctx.setAsOf(asOf);
    const sum = (state) => queues.reduce((n, q) => n + (q.counts[state] || 0), 0);
    const done = queues.reduce((n, q) => n + Number(q.throughput.completed_per_minute["1m"] || 0), 0);
    const lag = asOf && asOf.at ? `${span(secondsSince(asOf.at))} ago` : "not yet";
    replace(
      tiles,
      tile(num(queues.length), "queues"),
      tile(num(sum("WAITING")), "waiting"),
      tile(num(sum("PENDING")), "pending"),
      tile(num(sum("RUNNING")), "running"),
      tile(num(sum("SUSPENDED")), "suspended on callbacks"),
      tile(num(sum("DLQ")), "dead-lettered"),
      tile(`${rate(done)}/min`, "completed, last minute"),
      tile(lag, asOf ? `read models last projected (event #${asOf.seq})` : "read models last projected"),
    );
    if (!queues.length) {
      replace(
        table,
        h("div", { class: "card empty" }, "No queues yet. A queue appears here once jobs are submitted to it and the projector has caught up."),
      );
      return;
    }
    replace(
      table,
      dataTable({
        table: { id: "queues-table" },
        caption: "Queues",
        heads: [
          "Queue",
          "Status",
          STATES.map((state) => h("th", { scope: "col", class: "num" }, stateLabel(state, STATE_TITLES[state]))),
          h("th", { scope: "col", class: "num", title: "Completed per minute over the last 1, 5 and 15 minutes" }, "Done/min 1m·5m·15m"),
          h("th", { scope: "col", title: "Completed per minute over the last hour" }, "Trend (1 h)"),
          h("th", { scope: "col", class: "num", title: "Wait: from due to claimed. Run: from claimed to finished." }, "Latency p50 · p95 · p99"),
          "Oldest pending",
        ],
        rows: queues.map((q) => queueRow(q, historyOf.get(q.queue))),
      }),
    );
  }

  return { title: "Queues", refresh };
}
