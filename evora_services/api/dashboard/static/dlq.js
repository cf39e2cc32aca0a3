// The dead-letter queue across queues: retry or discard jobs one by one.

import { api, apiAll, ApiError, seg, withQuery } from "./api.js";
import { confirmDialog, h, replace } from "./dom.js";
import { jobIdCell, shortId, stateBadge } from "./format.js";
import { jobRow, jobsTable, pager } from "./queue.js";

function hashFor({ queue = "", type = "", after = "" } = {}) {
  return withQuery("#/dlq", { queue, type, after });
}

export function mount(root, params, ctx) {
  const queue = params.queue || "";
  const type = params.type || "";
  const after = params.after || "";
  const stackKey = `dlq:${queue}:${type}`;
  const stack = (ctx.memory[stackKey] = after ? ctx.memory[stackKey] || [] : []);
  // Jobs acted on from this page, shown with their current state until the page is left.
  const recent = new Map(); // id -> {verb, job}

  const queueInput = h("input", { id: "dlq-queue", name: "queue", value: queue, list: "dlq-queues", placeholder: "all queues", autocomplete: "off", spellcheck: "false", "data-focus-key": "dlq-queue" });
  const queueList = h("datalist", { id: "dlq-queues" });
  const typeInput = h("input", { id: "dlq-type", name: "type", value: type, placeholder: "any type", autocomplete: "off", spellcheck: "false", "data-focus-key": "dlq-type" });
  const form = h(
    "form",
    { class: "filters", "aria-label": "Filter dead-lettered jobs" },
    h("div", { class: "field" }, h("label", { for: "dlq-queue" }, "Queue"), queueInput, queueList),
    h("div", { class: "field" }, h("label", { for: "dlq-type" }, "Type"), typeInput),
    h("button", { type: "submit", class: "primary", "data-focus-key": "dlq-apply" }, "Apply"),
    h("button", { type: "button", "data-focus-key": "dlq-clear", onclick: () => ctx.navigate("#/dlq") }, "Clear filters"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    ctx.navigate(hashFor({ queue: queueInput.value.trim(), type: typeInput.value.trim() }));
  });
  const recentBox = h("div", { "aria-live": "polite" });
  const list = h("div");
  replace(
    root,
    h("div", { class: "title-row" }, h("h1", null, "Dead-letter queue")),
    h("p", { class: "muted" }, "Jobs that ran out of attempts, failed with a non-retryable error, or expired before they started. Retry moves a job back to PENDING with a fresh attempt budget; discard moves it to CANCELLED."),
    form,
    recentBox,
    list,
  );

  function renderRecent() {
    if (!recent.size) {
      replace(recentBox);
      return;
    }
    replace(
      recentBox,
      h("h2", null, "Recent actions"),
      h(
        "ul",
        { class: "recent", id: "recent-actions" },
        [...recent.values()].reverse().map(({ verb, job }) =>
          h(
            "li",
            { "data-job": job.id },
            `${verb} `,
            jobIdCell(job.id),
            ` (${job.queue} / ${job.type}): now `,
            stateBadge(job.state),
          ),
        ),
      ),
    );
  }

  async function act(button, job, verb, path) {
    button.disabled = true;
    try {
      const updated = await api(path, { method: "POST" });
      recent.set(job.id, { verb, job: updated });
      renderRecent();
      const row = list.querySelector(`tr[data-job="${CSS.escape(job.id)}"]`);
      if (row) {
        replace(row.querySelector(".job-state"), stateBadge(updated.state));
        replace(row.querySelector(".row-actions"), h("span", { class: "muted" }, `${verb}`));
      }
      ctx.announce(`${verb} job ${shortId(job.id)} of ${job.queue}: now ${updated.state}.`);
    } catch (error) {
      button.disabled = false;
      if (!(error instanceof ApiError && error.status === 401)) ctx.announce(`Could not change job ${shortId(job.id)}: ${ctx.describe(error)}`, { error: true });
    }
  }

  function row(job, options) {
    const tr = jobRow(job, options);
    const retry = h("button", { type: "button", class: "small primary", "data-focus-key": `retry:${job.id}`, "aria-label": `Retry job ${job.id}` }, "Retry");
    const discard = h("button", { type: "button", class: "small danger", "data-focus-key": `discard:${job.id}`, "aria-label": `Discard job ${job.id}` }, "Discard…");
    retry.addEventListener("click", () => act(retry, job, "Retried", `/v1/jobs/${seg(job.id)}/retry`));
    discard.addEventListener("click", async () => {
      const ok = await confirmDialog({
        title: "Discard this job?",
        body: `Job ${job.id} of queue “${job.queue}” moves to CANCELLED and will not run again.`,
        confirm: "Discard",
        danger: true,
      });
      if (ok) await act(discard, job, "Discarded", `/v1/jobs/${seg(job.id)}/discard`);
      else discard.focus();
    });
    tr.appendChild(h("td", { class: "row-actions nowrap" }, h("div", { class: "actions" }, retry, discard)));
    return tr;
  }

  async function refresh() {
    const [page, queues] = await Promise.all([
      api(withQuery("/v1/jobs", { state: "DLQ", queue, type, after, limit: 50 })),
      apiAll("/v1/queues", "queues").catch((error) => {
        if (error instanceof ApiError && error.status === 401) throw error;
        return []; // the read models only feed the queue suggestions
      }),
    ]);
    replace(queueList, queues.map((q) => h("option", { value: q.queue })));
    if (queues.length) ctx.setAsOf(queues[0].as_of);
    // refresh the state of jobs acted on
    const current = await Promise.all(
      [...recent.keys()].map((id) => api(`/v1/jobs/${seg(id)}`).catch(() => null)),
    );
    for (const job of current) if (job) recent.get(job.id).job = job;
    renderRecent();
    const caption = `Dead-lettered jobs${queue ? ` of queue ${queue}` : " of every queue"}${type ? `, type ${type}` : ""}, newest first`;
    replace(
      list,
      page.jobs.length
        ? jobsTable(page.jobs, { caption, showQueue: true, row, extraHead: h("th", { scope: "col" }, "Actions") })
        : h("div", { class: "card empty" }, after ? "No more dead-lettered jobs." : "The dead-letter queue is empty."),
      pager({ page, stack, after, label: "Dead letters", go: (next) => ctx.navigate(hashFor({ queue, type, after: next })) }),
    );
  }

  return { title: "Dead-letter queue", refresh };
}
