// Workers seen in the last 24 hours, from the read models.

import { apiAll, seg } from "./api.js";
import { dataTable, h, replace } from "./dom.js";
import { ago, jobIdCell, num, secondsSince, time } from "./format.js";

const ACTIVE_WITHIN_S = 60;

function activity(worker) {
  const since = secondsSince(worker.last_seen);
  if (since !== null && since <= ACTIVE_WITHIN_S) return h("span", { class: "state state-active" }, "● active");
  return h("span", { class: "state state-CANCELLED" }, "○ idle");
}

function row(w) {
  return h(
    "tr",
    { "data-worker": w.worker_id },
    h("th", { scope: "row", class: "mono" }, w.worker_id),
    h("td", null, activity(w)),
    h("td", null, (w.queues || []).flatMap((q, i) => [i ? ", " : "", h("a", { href: `#/queues/${seg(q)}` }, q)])),
    h("td", { class: "num" }, num(w.running)),
    h(
      "td",
      { class: "mono" },
      (w.current_jobs || []).slice(0, 5).flatMap((id, i) => [i ? " " : "", jobIdCell(id)]),
      (w.current_jobs || []).length > 5 ? ` +${w.current_jobs.length - 5} more` : "",
    ),
    h("td", { class: "num" }, num(w.claimed)),
    h("td", { class: "num" }, num(w.completed)),
    h("td", { class: "num" }, num(w.failed)),
    h("td", { class: "num" }, num(w.released)),
    h("td", { class: "num" }, num(w.lease_expired)),
    h("td", { class: "nowrap" }, time(w.first_seen)),
    h("td", { class: "nowrap" }, ago(w.last_seen)),
  );
}

export function mount(root, params, ctx) {
  const list = h("div");
  replace(
    root,
    h("div", { class: "title-row" }, h("h1", null, "Workers")),
    h("p", { class: "muted" }, `Workers seen in the last 24 hours, most recent first. Active: seen in the last ${ACTIVE_WITHIN_S} s.`),
    list,
  );

  async function refresh() {
    const workers = await apiAll("/v1/workers", "workers");
    if (!workers.length) {
      replace(list, h("div", { class: "card empty" }, "No worker has claimed a job in the last 24 hours."));
      return;
    }
    replace(
      list,
      dataTable({
        table: { id: "workers-table" },
        caption: "Workers",
        heads: [
          "Worker",
          "Status",
          "Queues",
          h("th", { scope: "col", class: "num" }, "Running"),
          "Current jobs",
          ["Claimed", "Completed", "Failed", "Released", "Leases expired"].map((t) => h("th", { scope: "col", class: "num" }, t)),
          "First seen",
          "Last seen",
        ],
        rows: workers.map(row),
      }),
    );
  }

  return { title: "Workers", refresh };
}
