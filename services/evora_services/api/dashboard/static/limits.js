// Concurrency and rate limits: every limit with its usage (RUNNING holders, tokens left, jobs
// held back and for how long, until when an upstream throttles the key), set and delete; and per limit the concrete keys it governs
// (for `tenant:*`, each tenant), a page at a time: there may be millions of them.

import { api, ApiError, seg, withQuery } from "./api.js";
import { confirmDialog, dataTable, h, keysetPager, replace } from "./dom.js";
import { countCell, num, secondsSince, span, time } from "./format.js";

const LIMITS_PAGE = 25;
const KEYS_PAGE = 50;

function kind(key) {
  if (key.endsWith("*")) return "prefix";
  if (key.startsWith("queue:")) return "queue";
  return "key";
}

function rateText(rate) {
  return rate ? `${num(rate.limit)} per ${num(rate.per_seconds)} s` : "—";
}

/** "5 / 5" (RUNNING holders of the key out of its concurrency), marked when at the limit. */
function runningCell(running, concurrency) {
  const full = concurrency !== null && running >= concurrency;
  const text = concurrency === null ? num(running) : `${num(running)} / ${num(concurrency)}`;
  return h("td", { class: `num limit-running${full ? " at-limit" : ""}`, title: full ? "No room left: jobs holding this key wait" : null }, text);
}

function tokensCell(tokens) {
  return h("td", { class: "num limit-tokens" }, tokens === null || tokens === undefined ? "—" : num(Math.floor(tokens)));
}

/** How long the longest held-back job has been due. */
function throttledCell(since) {
  const seconds = since ? secondsSince(since) : null;
  return h("td", { class: "nowrap limit-throttled", title: since || null }, seconds === null ? "—" : span(seconds));
}

function heldCell(jobs) {
  const cell = countCell(jobs);
  cell.classList.add("limit-held");
  return cell;
}

/** Until when an upstream's retry-after drains the key (a worker reported it on a failure). */
function upstreamCell(until) {
  return h("td", { class: "nowrap limit-upstream" }, until ? time(until) : "—");
}

function usageCells(usage, concurrency) {
  return [
    runningCell(usage.running, concurrency),
    tokensCell(usage.tokens),
    heldCell(usage.throttled_jobs),
    throttledCell(usage.throttled_since),
    upstreamCell(usage.throttled_until),
  ];
}

const USAGE_HEAD = ["Running", "Tokens", "Held back", "Throttled for", "Throttled until"];

function numberOrNull(input) {
  const text = input.value.trim();
  return text === "" ? null : Number(text);
}

/** The form that creates or replaces a limit (PUT /v1/limits/{key}). */
function limitForm(ctx) {
  const key = h("input", { id: "limit-key", name: "key", required: true, autocomplete: "off", spellcheck: "false", placeholder: "tenant:* or api:stripe or queue:emails", "data-focus-key": "limit-key" });
  const concurrency = h("input", { id: "limit-concurrency", name: "concurrency", type: "number", min: "1", step: "1", placeholder: "none", "data-focus-key": "limit-concurrency" });
  const rateLimit = h("input", { id: "limit-rate", name: "rate", type: "number", min: "1", step: "1", placeholder: "none", "data-focus-key": "limit-rate" });
  const per = h("input", { id: "limit-per", name: "per_seconds", type: "number", min: "0", step: "any", placeholder: "seconds", "data-focus-key": "limit-per" });
  const maxPending = h("input", { id: "limit-max-pending", name: "max_pending", type: "number", min: "1", step: "1", placeholder: "none", "data-focus-key": "limit-max-pending" });
  const save = h("button", { type: "submit", class: "primary", "data-focus-key": "limit-save" }, "Save limit");
  const form = h(
    "form",
    { class: "filters", id: "limit-form", "aria-label": "Set a limit" },
    h("div", { class: "field" }, h("label", { for: "limit-key" }, "Key"), key),
    h("div", { class: "field" }, h("label", { for: "limit-concurrency" }, "Concurrency"), concurrency),
    h("div", { class: "field" }, h("label", { for: "limit-rate" }, "Rate (claims)"), rateLimit),
    h("div", { class: "field" }, h("label", { for: "limit-per" }, "per seconds"), per),
    h("div", { class: "field" }, h("label", { for: "limit-max-pending" }, "Max pending"), maxPending),
    save,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const name = key.value.trim();
    const claims = numberOrNull(rateLimit);
    const seconds = numberOrNull(per);
    if (!name || (claims === null) !== (seconds === null)) {
      ctx.announce(name ? "A rate needs both its claims and its seconds." : "Enter the limit's key.", { error: true });
      return;
    }
    const body = {
      concurrency: numberOrNull(concurrency),
      rate: claims === null ? null : { limit: claims, per_seconds: seconds },
      max_pending: numberOrNull(maxPending),
    };
    save.disabled = true;
    try {
      await api(`/v1/limits/${seg(name)}`, { method: "PUT", body });
      ctx.announce(`Limit ${name} saved.`);
      await ctx.refreshNow();
    } catch (error) {
      if (!(error instanceof ApiError && error.status === 401)) ctx.announce(`Could not save limit ${name}: ${ctx.describe(error)}`, { error: true });
    } finally {
      save.disabled = false;
    }
  });
  /** Fill the form with a limit, to change it. */
  function edit(limit) {
    key.value = limit.key;
    concurrency.value = limit.concurrency ?? "";
    rateLimit.value = limit.rate ? limit.rate.limit : "";
    per.value = limit.rate ? limit.rate.per_seconds : "";
    maxPending.value = limit.max_pending ?? "";
    concurrency.focus();
  }
  return { form, edit };
}

function limitsMount(root, params, ctx) {
  const after = params.after || "";
  const stack = (ctx.memory.limits = after ? ctx.memory.limits || [] : []);
  const { form, edit } = limitForm(ctx);
  const list = h("div");
  replace(
    root,
    h("div", { class: "title-row" }, h("h1", null, "Limits")),
    h("p", { class: "muted" }, "At most Concurrency jobs holding a key run at once, at most Rate claims start per period, and at most Max pending wait to run (a submission over it is refused). A prefix limit (tenant:*) applies to every key under it separately: open it to see each key. Held back: due jobs waiting because a key has no room left; Throttled for: how long the longest of them has waited."),
    form,
    list,
  );

  async function remove(button, limit) {
    const ok = await confirmDialog({
      title: `Delete limit ${limit.key}?`,
      body: `Jobs holding ${limit.key}${limit.key.endsWith("*") ? " (or a key under it without a limit of its own)" : ""} are no longer held back by it; waiting workers are woken.`,
      confirm: "Delete",
      danger: true,
    });
    if (!ok) {
      button.focus();
      return;
    }
    button.disabled = true;
    try {
      await api(`/v1/limits/${seg(limit.key)}`, { method: "DELETE" });
      ctx.announce(`Limit ${limit.key} deleted.`);
      await ctx.refreshNow();
    } catch (error) {
      button.disabled = false;
      if (!(error instanceof ApiError && error.status === 401)) ctx.announce(`Could not delete limit ${limit.key}: ${ctx.describe(error)}`, { error: true });
    }
  }

  function row(limit, usage) {
    const editButton = h("button", { type: "button", class: "small", "data-focus-key": `limit-edit:${limit.key}`, "aria-label": `Edit limit ${limit.key}` }, "Edit");
    editButton.addEventListener("click", () => edit(limit));
    const deleteButton = h("button", { type: "button", class: "small danger", "data-focus-key": `limit-delete:${limit.key}`, "aria-label": `Delete limit ${limit.key}` }, "Delete…");
    deleteButton.addEventListener("click", () => remove(deleteButton, limit));
    const prefix = limit.key.endsWith("*");
    return h(
      "tr",
      { "data-limit": limit.key },
      h("th", { scope: "row", class: "mono" }, h("a", { href: `#/limits/${seg(limit.key)}`, title: prefix ? "Each key under this prefix" : "This key's usage" }, limit.key)),
      h("td", null, kind(limit.key)),
      h("td", { class: "num" }, num(limit.concurrency)),
      h("td", { class: "nowrap" }, rateText(limit.rate)),
      usageCells(usage, limit.concurrency),
      h("td", { class: "actions nowrap" }, editButton, " ", deleteButton),
    );
  }

  async function refresh() {
    const page = await api(withQuery("/v1/limits", { limit: LIMITS_PAGE, after }));
    // one usage read per limit of the page: bounded by the page, not by the keys that exist
    const usages = await Promise.all(page.limits.map((limit) => api(`/v1/limits/${seg(limit.key)}`)));
    if (!page.limits.length && !after) {
      replace(list, h("div", { class: "card empty" }, "No limits yet. Set one above, or with PUT /v1/limits/{key}."));
      return;
    }
    replace(
      list,
      dataTable({
        table: { id: "limits-table" },
        caption: "Limits and their usage",
        heads: ["Key", "Kind", "Concurrency", "Rate", ...USAGE_HEAD, "Actions"],
        rows: page.limits.map((limit, i) => row(limit, usages[i])),
      }),
      keysetPager({ next: page.next, stack, after, label: "Limits", shown: page.limits.length, go: (to) => ctx.navigate(withQuery("#/limits", { after: to })) }),
    );
  }

  return { title: "Limits", refresh };
}

function keysMount(root, params, ctx) {
  const key = params.key;
  const after = params.after || "";
  const stackKey = `limit-keys:${key}`;
  const stack = (ctx.memory[stackKey] = after ? ctx.memory[stackKey] || [] : []);
  const facts = h("dl", { class: "facts" });
  const list = h("div");
  replace(
    root,
    h("p", null, h("a", { href: "#/limits" }, "← All limits")),
    h("div", { class: "title-row" }, h("h1", { class: "mono" }, `Limit ${key}`)),
    facts,
    list,
  );

  async function refresh() {
    const page = await api(withQuery(`/v1/limits/${seg(key)}/keys`, { limit: KEYS_PAGE, after }));
    const limit = page.limit;
    replace(
      facts,
      h("dt", null, "Governed by"), h("dd", { class: "mono" }, limit.governed_by),
      h("dt", null, "Concurrency"), h("dd", null, num(limit.concurrency)),
      h("dt", null, "Rate"), h("dd", null, rateText(limit.rate)),
    );
    const note = key.endsWith("*")
      ? "The keys under this prefix without a limit of their own that have a token bucket (kept from a claim until it is full again) or RUNNING jobs, in key order. A key not listed has all its room."
      : "This key's usage.";
    replace(
      list,
      h("p", { class: "muted" }, note),
      page.keys.length
        ? dataTable({
            table: { id: "limit-keys-table" },
            caption: `Keys governed by ${key}`,
            heads: ["Key", ...USAGE_HEAD],
            rows: page.keys.map((k) => h("tr", { "data-key": k.key }, h("th", { scope: "row", class: "mono" }, k.key), usageCells(k, limit.concurrency))),
          })
        : h("div", { class: "card empty" }, "No key under this limit has been claimed yet."),
      keysetPager({ next: page.next, stack, after, label: "Keys", shown: page.keys.length, go: (to) => ctx.navigate(withQuery(`#/limits/${seg(key)}`, { after: to })) }),
    );
  }

  return { title: `Limit ${key}`, refresh };
}

export const limits = { mount: limitsMount };
export const limitKeys = { mount: keysMount };
