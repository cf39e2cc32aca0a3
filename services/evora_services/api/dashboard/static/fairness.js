// Fairness keys (docs/flow-control.md, "Fairness keys"): the fair queues, and per queue its
// keys a page at a time (a queue may have thousands), each with the weight that applies and
// who set it, its due backlog and longest wait, and its share of the held lease time against
// its weight's share; set a weight, or delete the one a key is weighed by.

import { api, ApiError, seg, withQuery } from "./api.js";
import { confirmDialog, dataTable, h, keysetPager, replace } from "./dom.js";
import { countCell, num, span } from "./format.js";

const KEYS_PAGE = 50;

/** "25 %"; "—" while there is nothing to share. */
function percent(share) {
  return share === null || share === undefined ? "—" : `${Math.round(share * 100)} %`;
}

/** Who set the weight that applies: the key itself, a prefix, or nobody (1). */
function setByText(key, setBy) {
  if (setBy === null) return "default";
  return setBy === key ? "own" : `prefix ${setBy}`;
}

/** The form that sets the weight of a key or prefix (PUT /v1/fairness/{key}). */
function weightForm(ctx) {
  const key = h("input", { id: "weight-key", name: "key", required: true, autocomplete: "off", spellcheck: "false", placeholder: "tenant:acme or gold:*", "data-focus-key": "weight-key" });
  const weight = h("input", { id: "weight-value", name: "weight", type: "number", required: true, step: "any", placeholder: "1", "data-focus-key": "weight-value" });
  const save = h("button", { type: "submit", class: "primary", "data-focus-key": "weight-save" }, "Save weight");
  const form = h(
    "form",
    { class: "filters", id: "weight-form", "aria-label": "Set a weight" },
    h("div", { class: "field" }, h("label", { for: "weight-key" }, "Key"), key),
    h("div", { class: "field" }, h("label", { for: "weight-value" }, "Weight"), weight),
    save,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const name = key.value.trim();
    save.disabled = true;
    try {
      await api(`/v1/fairness/${seg(name)}`, { method: "PUT", body: { weight: Number(weight.value) } });
      ctx.announce(`Weight of ${name} saved.`);
      await ctx.refreshNow();
    } catch (error) {
      if (!(error instanceof ApiError && error.status === 401)) ctx.announce(`Could not save the weight of ${name}: ${ctx.describe(error)}`, { error: true });
    } finally {
      save.disabled = false;
    }
  });
  return form;
}

const NOTE = "A fair queue shares its workers among its keys by weight (0.001 to 1000, default 1), charged with the lease time their jobs hold. A prefix weight (gold:*) weighs every key under it, each on its own. Held share: the key's part of the lease time the queue's keys held; weight share: what it is owed while every key has work.";

function fairnessMount(root, params, ctx) {
  const list = h("div");
  replace(root, h("div", { class: "title-row" }, h("h1", null, "Fairness")), h("p", { class: "muted" }, NOTE), weightForm(ctx), list);

  async function refresh() {
    const page = await api("/v1/fairness");
    if (!page.queues.length) {
      replace(list, h("div", { class: "card empty" }, "No fair queue yet: a queue becomes fair with its first job that has a fairness_key."));
      return;
    }
    replace(
      list,
      dataTable({
        table: { id: "fair-queues-table" },
        caption: "Fair queues",
        heads: ["Queue", "Keys", "Keys with work"],
        rows: page.queues.map((q) =>
          h(
            "tr",
            { "data-queue": q.queue },
            h("th", { scope: "row", class: "mono" }, h("a", { href: `#/fairness/${seg(q.queue)}`, title: "This queue's keys" }, q.queue)),
            h("td", { class: "num fair-keys" }, num(q.keys)),
            countCell(q.backlogged_keys),
          ),
        ),
      }),
    );
  }

  return { title: "Fairness", refresh };
}

function keysMount(root, params, ctx) {
  const queue = params.queue;
  const after = params.after || "";
  const stackKey = `fair-keys:${queue}`;
  const stack = (ctx.memory[stackKey] = after ? ctx.memory[stackKey] || [] : []);
  const list = h("div");
  replace(
    root,
    h("p", null, h("a", { href: "#/fairness" }, "← All fair queues")),
    h("div", { class: "title-row" }, h("h1", null, `Fairness ${queue}`)),
    h("p", { class: "muted" }, NOTE),
    weightForm(ctx),
    list,
  );

  async function remove(button, setBy) {
    const ok = await confirmDialog({
      title: `Delete weight ${setBy}?`,
      body: `The keys ${setBy.endsWith("*") ? "under it without a weight of their own" : "it names"} fall back to a shorter prefix's weight, else 1.`,
      confirm: "Delete",
      danger: true,
    });
    if (!ok) {
      button.focus();
      return;
    }
    button.disabled = true;
    try {
      await api(`/v1/fairness/${seg(setBy)}`, { method: "DELETE" });
      ctx.announce(`Weight ${setBy} deleted.`);
      await ctx.refreshNow();
    } catch (error) {
      button.disabled = false;
      if (!(error instanceof ApiError && error.status === 401)) ctx.announce(`Could not delete weight ${setBy}: ${ctx.describe(error)}`, { error: true });
    }
  }

  function row(k) {
    const actions = h("td", { class: "actions nowrap" });
    if (k.set_by !== null) {
      const button = h("button", { type: "button", class: "small danger", "data-focus-key": `weight-delete:${k.key}`, "aria-label": `Delete weight ${k.set_by}` }, "Delete…");
      button.addEventListener("click", () => remove(button, k.set_by));
      actions.append(button);
    }
    const backlog = countCell(k.backlog);
    backlog.classList.add("fair-backlog");
    return h(
      "tr",
      { "data-key": k.key },
      h("th", { scope: "row", class: "mono" }, k.key),
      h("td", { class: "num fair-weight" }, num(k.weight)),
      h("td", { class: "mono fair-set-by" }, setByText(k.key, k.set_by)),
      backlog,
      h("td", { class: "nowrap fair-wait" }, k.longest_wait_seconds === null ? "—" : span(k.longest_wait_seconds)),
      h("td", { class: "num" }, num(k.running)),
      h("td", { class: "num" }, num(k.served)),
      h("td", { class: "nowrap" }, span(k.held_seconds)),
      h("td", { class: "num fair-held-share" }, percent(k.held_share)),
      h("td", { class: "num fair-weight-share" }, percent(k.weight_share)),
      actions,
    );
  }

  async function refresh() {
    const page = await api(withQuery("/v1/fairness", { queue, limit: KEYS_PAGE, after }));
    replace(
      list,
      page.keys.length
        ? dataTable({
            table: { id: "fair-keys-table" },
            caption: `Keys of ${queue}`,
            heads: ["Key", "Weight", "Set by", "Backlog", "Longest wait", "Running", "Served", "Held", "Held share", "Weight share", "Actions"],
            rows: page.keys.map(row),
          })
        : h("div", { class: "card empty" }, "No key of this queue has been seen by a claim yet."),
      keysetPager({ next: page.next, stack, after, label: "Keys", shown: page.keys.length, go: (to) => ctx.navigate(withQuery(`#/fairness/${seg(queue)}`, { after: to })) }),
    );
  }

  return { title: `Fairness ${queue}`, refresh };
}

export const fairness = { mount: fairnessMount };
export const fairKeys = { mount: keysMount };
