// One job: its fields, payload, result, last error, lease, the jobs it waits for and that
// wait for it (graph.js), and the full event timeline.
// Payloads, results and errors are shown as text (JSON.stringify into textContent).

import { api, ApiError, seg } from "./api.js";
import { confirmDialog, h, replace } from "./dom.js";
import { dependencyGraph, loadNeighbours } from "./graph.js";
import { ago, copyButton, shortId, jsonBlock, runsIn, stateBadge, time } from "./format.js";

function fact(label, ...value) {
  return [h("dt", null, label), h("dd", null, ...value)];
}

function maybe(value) {
  return value === null || value === undefined || value === "" ? h("span", { class: "muted" }, "—") : String(value);
}

function leaseText(job) {
  if (job.state !== "RUNNING" || !job.lease_expires_at) return [h("span", { class: "muted" }, "no lease")];
  const left = (new Date(job.lease_expires_at).getTime() - Date.now()) / 1000;
  return [
    left >= 0 ? "expires " : "expired ",
    ago(job.lease_expires_at),
    ` (held by ${job.worker_id || "unknown worker"}, ${job.lease_seconds} s per claim)`,
  ];
}

// What a SUSPENDED job waits for, or what the callback it last waited on became
// (docs/callbacks.md).
function callbackText(job) {
  const cb = job.callback;
  if (!cb) return [h("span", { class: "muted" }, "none")];
  if (job.state === "SUSPENDED") {
    return [
      "waits for callback ",
      h("span", { class: "mono", id: "callback-id" }, shortId(cb.id)),
      " until ",
      time(cb.timeout_at),
      ` (then ${cb.on_timeout})`,
    ];
  }
  if (cb.timed_out) return ["last callback timed out at ", time(cb.timeout_at), ` (${cb.on_timeout})`];
  if (cb.resolved_at) return ["last callback resolved ", ago(cb.resolved_at)];
  return ["last callback not resolved"];
}

function transition(event) {
  return event.from_state ? [stateBadge(event.from_state), " → ", stateBadge(event.to_state)] : ["→ ", stateBadge(event.to_state)];
}

function timelineItem(event) {
  const hasData = event.data && Object.keys(event.data).length > 0;
  return h(
    "li",
    { "data-event": event.event, "data-seq": String(event.seq) },
    h(
      "div",
      { class: "event-head" },
      h("span", { class: "event-name" }, event.event),
      h("span", null, transition(event)),
      time(event.at),
      h("span", { class: "muted" }, `attempt ${event.attempt}`),
      event.worker_id ? h("span", { class: "muted" }, `worker ${event.worker_id}`) : null,
      h("span", { class: "muted" }, `#${event.seq}`),
    ),
    hasData ? eventData(event) : null,
  );
}

// An error's traceback is many lines: inside the JSON it would show as one line of literal
// "\n"s, so it is taken out and shown as text of its own.
function eventData(event) {
  const error = event.data.error;
  if (!error || typeof error.traceback !== "string") return jsonBlock(event.data, `Data of event ${event.seq}`);
  const { traceback, ...shownError } = error;
  return [
    jsonBlock({ ...event.data, error: shownError }, `Data of event ${event.seq}`),
    h(
      "details",
      { class: "traceback" },
      h("summary", null, "Stack trace"),
      h("pre", { class: "json", tabindex: "0", "aria-label": `Stack trace of event ${event.seq}` }, traceback),
    ),
  ];
}

export function mount(root, params, ctx) {
  const id = params.id;
  let job = null;
  const badge = h("span");
  const actions = h("div", { class: "actions" });
  const body = h("div");
  replace(
    root,
    h("p", { class: "muted", id: "crumbs" }, h("a", { href: "#/" }, "Queues")),
    h("div", { class: "title-row" }, h("h1", null, "Job ", h("span", { class: "mono" }, id)), copyButton(id, "job id"), badge, actions),
    body,
  );

  async function act(button, verb, path, done, body) {
    button.disabled = true;
    try {
      const updated = await api(path, { method: "POST", body });
      ctx.announce(updated.state ? `${done}: job ${id} is now ${updated.state}.` : `${done}: job ${id}.`);
    } catch (error) {
      if (!(error instanceof ApiError && error.status === 401)) ctx.announce(`Could not ${verb} job ${id}: ${ctx.describe(error)}`, { error: true });
    } finally {
      await ctx.refreshNow();
    }
  }

  function button(label, key, handler, cls) {
    const b = h("button", { type: "button", class: cls, "data-focus-key": key }, label);
    b.addEventListener("click", () => handler(b));
    return b;
  }

  function renderActions(hasDependents) {
    const list = [];
    if (job.state === "DLQ") {
      list.push(button("Retry", "retry", (b) => act(b, "retry", `/v1/jobs/${seg(id)}/retry`, "Retried"), "primary"));
      list.push(
        button("Discard…", "discard", async (b) => {
          const ok = await confirmDialog({
            title: "Discard this job?",
            body: `Job ${id} moves from the dead-letter queue to CANCELLED and will not run again.`,
            confirm: "Discard",
            danger: true,
          });
          if (ok) await act(b, "discard", `/v1/jobs/${seg(id)}/discard`, "Discarded");
          else b.focus();
        }, "danger"),
      );
    }
    if (job.state === "SUSPENDED") {
      list.push(
        button("Resolve…", "resolve", async (b) => {
          const field = h("textarea", { id: "resolve-payload", rows: "4", "aria-label": "Payload (JSON)" }, "null");
          const ok = await confirmDialog({
            title: "Resolve its callback?",
            body: `Job ${id} runs again, and its next attempt sees this payload (JSON), as if the callback's sender had resolved it.`,
            confirm: "Resolve",
            extra: field,
          });
          if (!ok) return b.focus();
          let payload;
          try {
            payload = JSON.parse(field.value || "null");
          } catch (error) {
            ctx.announce(`Could not resolve job ${id}: the payload is not JSON (${error.message})`, { error: true });
            return b.focus();
          }
          await act(b, "resolve", `/v1/jobs/${seg(id)}/resolve`, "Resolved", { payload });
        }, "primary"),
      );
    }
    if (["WAITING", "PENDING", "RUNNING", "SUSPENDED"].includes(job.state)) {
      list.push(
        button("Cancel job…", "cancel", async (b) => {
          const ok = await confirmDialog({
            title: "Cancel this job?",
            body: [
              job.state === "RUNNING"
                ? `Job ${id} is running: its worker is asked to stop it.`
                : `Job ${id} is cancelled now and will not run.`,
              // the database cancels them as the job ends CANCELLED (docs/dependencies.md)
              hasDependents ? "Jobs waiting for it are cancelled too, unless they were submitted to run anyway (on_dependency_failure \"run\")." : null,
            ].filter(Boolean),
            confirm: "Cancel job",
            danger: true,
          });
          if (ok) await act(b, "cancel", `/v1/jobs/${seg(id)}/cancel`, "Cancelled");
          else b.focus();
        }, "danger"),
      );
    }
    replace(actions, list);
  }

  async function refresh() {
    let events;
    try {
      [job, { events }] = await Promise.all([api(`/v1/jobs/${seg(id)}`), api(`/v1/jobs/${seg(id)}/events`)]);
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) {
        replace(badge);
        replace(actions);
        replace(body, h("div", { class: "card empty" }, "There is no job with this id (it may have been removed by retention)."));
        return;
      }
      throw error;
    }
    const neighbours = await loadNeighbours(job);
    const crumbs = root.querySelector("#crumbs");
    replace(crumbs, h("a", { href: "#/" }, "Queues"), " / ", h("a", { href: `#/queues/${seg(job.queue)}` }, job.queue), " / ", "job");
    replace(badge, stateBadge(job.state));
    renderActions(neighbours.children.length > 0);
    const error = job.last_error;
    replace(
      body,
      h(
        "div",
        { class: "grid" },
        h(
          "section",
          { class: "card", "aria-labelledby": "facts-title" },
          h("h2", { id: "facts-title" }, "Details"),
          h(
            "dl",
            { class: "facts" },
            fact("Queue", h("a", { href: `#/queues/${seg(job.queue)}` }, job.queue)),
            fact("Type", h("span", { class: "mono" }, job.type)),
            fact("State", stateBadge(job.state), job.cancel_requested ? " (cancel requested)" : ""),
            fact("Attempt", `${job.attempt} of ${job.max_attempts}`),
            fact("Lease", ...leaseText(job)),
            fact("Callback", ...callbackText(job)),
            fact("Worker", maybe(job.worker_id)),
            fact("Priority", String(job.priority)),
            fact("Run at", time(job.run_at), runsIn(job) && [" (", runsIn(job), ")"]),
            fact("Created", time(job.created_at)),
            fact("Started", time(job.started_at)),
            fact("Finished", time(job.finished_at)),
            fact("Updated", ago(job.updated_at)),
            fact("Expires", time(job.expires_at)),
            fact("Group key", maybe(job.group_key)),
            fact("Idempotency key", maybe(job.idempotency_key)),
          ),
        ),
        h(
          "section",
          { class: "card", "aria-labelledby": "payload-title" },
          h("h2", { id: "payload-title" }, "Payload"),
          jsonBlock(job.payload, "Payload JSON", "payload"),
          h("h2", { id: "result-title" }, "Result"),
          job.result === null || job.result === undefined ? h("p", { class: "muted" }, "No result.") : jsonBlock(job.result, "Result JSON", "result"),
          h("h2", { id: "error-title" }, "Last error"),
          error
            ? h(
                "div",
                { id: "last-error" },
                error.type ? h("p", null, h("strong", null, "Type: "), h("span", { class: "mono" }, error.type)) : null,
                h("pre", { class: "json error-message", id: "error-message", tabindex: "0", "aria-label": "Last error message" }, error.message),
                error.traceback
                  ? h("details", { class: "traceback", open: true }, h("summary", null, "Stack trace"), h("pre", { class: "json", id: "error-traceback", tabindex: "0", "aria-label": "Stack trace of the last error" }, error.traceback))
                  : null,
              )
            : h("p", { class: "muted" }, "No error."),
          job.progress === null || job.progress === undefined ? null : [h("h2", null, "Progress"), jsonBlock(job.progress, "Progress JSON", "progress")],
        ),
      ),
      dependencyGraph(job, neighbours),
      h(
        "section",
        { class: "card timeline-card", "aria-labelledby": "timeline-title" },
        h("h2", { id: "timeline-title" }, `Timeline (${events.length} event${events.length === 1 ? "" : "s"}, oldest first)`),
        events.length ? h("ol", { class: "timeline", id: "timeline" }, events.map(timelineItem)) : h("p", { class: "muted" }, "No events (older ones may have been removed by retention)."),
      ),
    );
  }

  return { title: `Job ${shortId(id)}`, refresh };
}
