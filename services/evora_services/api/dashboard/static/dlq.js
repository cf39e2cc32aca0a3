// The dead-letter queue across queues: retry or discard jobs one by one, or those selected
// (after a confirmation).

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
  // Jobs of this page ticked for a bulk action, kept across auto-refreshes while listed.
  const selected = new Map(); // id -> job
  let pageJobs = [];
  let selectAll = null;
  const selectedCount = h("span", { id: "selected-count" });
  const retrySelected = h("button", { type: "button", class: "primary", "data-focus-key": "retry-selected" }, "Retry selected…");
  const discardSelected = h("button", { type: "button", class: "danger", "data-focus-key": "discard-selected" }, "Discard selected…");
  const bulkBar = h("div", { class: "bulk-bar actions", role: "group", "aria-label": "Selected jobs" }, selectedCount, retrySelected, discardSelected);
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

  /** Retry or discard one job; shows what became of it. Throws what the api refused. */
  async function change(job, verb, path) {
    const updated = await api(path, { method: "POST" });
    recent.set(job.id, { verb, job: updated });
    selected.delete(job.id);
    renderRecent();
    const row = list.querySelector(`tr[data-job="${CSS.escape(job.id)}"]`);
    if (row) {
      replace(row.querySelector(".job-state"), stateBadge(updated.state));
      replace(row.querySelector(".row-actions"), h("span", { class: "muted" }, `${verb}`));
      replace(row.querySelector(".select"));
    }
    renderSelection();
    return updated;
  }

  async function act(button, job, verb, path) {
    button.disabled = true;
    try {
      const updated = await change(job, verb, path);
      ctx.announce(`${verb} job ${shortId(job.id)} of ${job.queue}: now ${updated.state}.`);
    } catch (error) {
      button.disabled = false;
      if (!(error instanceof ApiError && error.status === 401)) ctx.announce(`Could not change job ${shortId(job.id)}: ${ctx.describe(error)}`, { error: true });
    }
  }

  function renderSelection() {
    const n = selected.size;
    selectedCount.textContent = n ? `${n} selected` : "Select jobs to act on several at once.";
    retrySelected.disabled = discardSelected.disabled = n === 0;
    if (selectAll) {
      const open = pageJobs.filter((job) => !recent.has(job.id));
      selectAll.checked = open.length > 0 && open.every((job) => selected.has(job.id));
      selectAll.indeterminate = n > 0 && !selectAll.checked;
    }
  }

  function checkbox(job) {
    const box = h("input", { type: "checkbox", "aria-label": `Select job ${job.id}`, "data-focus-key": `select:${job.id}`, checked: selected.has(job.id) });
    box.addEventListener("change", () => {
      if (box.checked) selected.set(job.id, job);
      else selected.delete(job.id);
      renderSelection();
    });
    return box;
  }

  async function bulk(button, { verb, action, title, consequence, confirm }) {
    const jobs = [...selected.values()];
    const count = `${jobs.length} job${jobs.length === 1 ? "" : "s"}`;
    const ok = await confirmDialog({
      title: `${title} ${count}?`,
      body: [`The ${count} selected ${consequence}`, jobs.map((job) => `${shortId(job.id)} (${job.queue} / ${job.type})`).join(", ")],
      confirm,
      danger: true,
    });
    if (!ok) {
      button.focus();
      return;
    }
    button.disabled = true;
    const refused = [];
    for (const job of jobs) {
      try {
        await change(job, verb, `/v1/jobs/${seg(job.id)}/${action}`);
      } catch (error) {
        if (error instanceof ApiError && error.status === 401) return; // sign-in shown
        refused.push(`${shortId(job.id)}: ${ctx.describe(error)}`);
      }
    }
    const done = jobs.length - refused.length;
    if (refused.length) ctx.announce(`${verb} ${done} of ${count}; not changed: ${refused.join("; ")}`, { error: true });
    else ctx.announce(`${verb} ${count}.`);
    await ctx.refreshNow();
    button.focus();
  }

  retrySelected.addEventListener("click", () =>
    bulk(retrySelected, { verb: "Retried", action: "retry", title: "Retry", consequence: "move back to PENDING with a fresh attempt budget; workers will run them again.", confirm: "Retry" }),
  );
  discardSelected.addEventListener("click", () =>
    bulk(discardSelected, { verb: "Discarded", action: "discard", title: "Discard", consequence: "move to CANCELLED and will not run again.", confirm: "Discard" }),
  );

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
    tr.insertBefore(h("td", { class: "select" }, checkbox(job)), tr.firstChild);
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
    pageJobs = page.jobs;
    const listed = new Set(pageJobs.map((job) => job.id));
    for (const id of [...selected.keys()]) if (!listed.has(id)) selected.delete(id);
    selectAll = h("input", { type: "checkbox", "aria-label": "Select every job of this page", "data-focus-key": "select-all" });
    selectAll.addEventListener("change", () => {
      for (const job of pageJobs) {
        if (selectAll.checked && !recent.has(job.id)) selected.set(job.id, job);
        else selected.delete(job.id);
      }
      for (const box of list.querySelectorAll("td.select input")) box.checked = selectAll.checked;
      renderSelection();
    });
    renderSelection();
    replace(
      list,
      page.jobs.length
        ? [
            bulkBar,
            jobsTable(page.jobs, {
              caption,
              showQueue: true,
              row,
              leadHead: h("td", { class: "select" }, selectAll),
              extraHead: h("th", { scope: "col" }, "Actions"),
            }),
          ]
        : h("div", { class: "card empty" }, after ? "No more dead-lettered jobs." : "The dead-letter queue is empty."),
      pager({ page, stack, after, label: "Dead letters", go: (next) => ctx.navigate(hashFor({ queue, type, after: next })) }),
    );
  }

  return { title: "Dead-letter queue", refresh };
}
