// Turning api values into text (and a few small elements). Everything returns text or
// nodes built with h(): nothing here parses markup.

import { h } from "./dom.js";

export const STATES = ["WAITING", "PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "DLQ", "CANCELLED"];
export const STATE_TITLES = { WAITING: "Waiting", PENDING: "Pending", RUNNING: "Running", SUSPENDED: "Suspended", COMPLETED: "Completed", DLQ: "DLQ", CANCELLED: "Cancelled" };

const pad = (n, width = 2) => String(n).padStart(width, "0");

function parse(iso) {
  if (!iso) return null;
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? null : date;
}

/** Local wall-clock time: "14:03:07" today, else "2026-11-20 14:03". */
export function clock(date, now = new Date()) {
  const time = `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
  const sameDay =
    date.getFullYear() === now.getFullYear() &&
    date.getMonth() === now.getMonth() &&
    date.getDate() === now.getDate();
  if (sameDay) return time;
  const day = `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}`;
  return `${day} ${time.slice(0, 5)}`;
}

/** "+01:00" style offset of a local time, "UTC" when there is none. */
function zone(date) {
  const offset = -date.getTimezoneOffset();
  if (offset === 0) return "UTC";
  const abs = Math.abs(offset);
  return `UTC${offset < 0 ? "-" : "+"}${pad(Math.floor(abs / 60))}:${pad(abs % 60)}`;
}

/** Local time with its date and zone, unambiguous in a shared incident channel:
 * "2026-11-24 14:03:07 UTC+01:00". */
export function stamp(date) {
  const day = `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}`;
  return `${day} ${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())} ${zone(date)}`;
}

/** "3 min ago" / "in 5 s" */
function relative(date, now = Date.now()) {
  const seconds = (now - date.getTime()) / 1000;
  return seconds >= 0 ? `${span(seconds)} ago` : `in ${span(-seconds)}`;
}

/** A <time> element with date and zone (how long ago on hover), or an em dash for null. */
export function time(iso) {
  const date = parse(iso);
  if (!date) return h("span", { class: "muted" }, "—");
  return h("time", { datetime: date.toISOString(), title: `${relative(date)} (${date.toISOString()})` }, stamp(date));
}

/** "12 s", "3 min", "2 h 5 min", "4 d" */
export function span(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return m % 60 ? `${hours} h ${m % 60} min` : `${hours} h`;
  return `${Math.floor(hours / 24)} d`;
}

export function secondsSince(iso, now = Date.now()) {
  const date = parse(iso);
  return date ? (now - date.getTime()) / 1000 : null;
}

/** "12 s ago" / "in 5 s" with the date, time and zone on hover. */
export function ago(iso, now = Date.now()) {
  const date = parse(iso);
  if (!date) return h("span", { class: "muted" }, "—");
  return h("time", { datetime: date.toISOString(), title: stamp(date) }, relative(date, now));
}

export function num(value) {
  if (value === null || value === undefined) return "—";
  return Number(value).toLocaleString("en-US", { maximumFractionDigits: 1 });
}

export function rate(value) {
  const n = Number(value || 0);
  return n >= 100 ? n.toFixed(0) : n.toFixed(1);
}

/** Milliseconds as "850 ms", "1.2 s", "3.4 min"; "—" for no measurement (null). */
export function ms(value) {
  if (value === null || value === undefined) return "—";
  const n = Number(value);
  if (n < 1000) return `${Math.round(n)} ms`;
  if (n < 60_000) return `${(n / 1000).toFixed(1)} s`;
  if (n < 3_600_000) return `${(n / 60_000).toFixed(1)} min`;
  return `${(n / 3_600_000).toFixed(1)} h`;
}

/** The class that gives an element its state's colours (style.css), "state-other" for a
 * name this page does not know. */
export function stateClass(state) {
  return `state-${STATES.includes(state) ? state : "other"}`;
}

/** The job state as text in a coloured pill: readable without the colour. */
export function stateBadge(state) {
  return h("span", { class: `state ${stateClass(state)}` }, state);
}

/** A state's name after a dot in its colour, for lists of states (tabs, column heads). */
export function stateLabel(state, text = state) {
  return [h("span", { class: `state-dot ${stateClass(state)}`, "aria-hidden": "true" }), text];
}

export function pausedBadge(paused) {
  return paused
    ? h("span", { class: "state state-paused" }, "‖ Paused")
    : h("span", { class: "state state-active" }, "▶ Active");
}

// A UUIDv7 starts with its timestamp, so jobs submitted together share their first
// characters; the last 12 are random and tell them apart.
const ID_TAIL = 12;

export function shortId(id) {
  return `…${String(id).slice(-ID_TAIL)}`;
}

/** A button that copies `text` to the clipboard and says so. */
export function copyButton(text, label) {
  const button = h("button", { type: "button", class: "small copy", title: `Copy ${label}`, "aria-label": `Copy ${label}` }, "copy");
  button.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(text);
      button.textContent = "copied";
    } catch {
      button.textContent = "no access"; // no clipboard (an insecure origin): the id is on hover
    }
    setTimeout(() => (button.textContent = "copy"), 1500);
  });
  return button;
}

/** A job id for a table: its distinct tail in monospace linking to the job, the full id
 * on hover and for screen readers, and a copy button. */
export function jobIdCell(id, focusKey) {
  return h(
    "span",
    { class: "job-id nowrap" },
    h("a", { href: `#/jobs/${encodeURIComponent(id)}`, class: "mono", title: id, "aria-label": `Job ${id}`, "data-focus-key": focusKey }, shortId(id)),
    " ",
    copyButton(id, `job id ${id}`),
  );
}

/** "runs in 5 min" for a pending job that is not due yet, else null. */
export function runsIn(job, now = Date.now()) {
  const due = job.state === "PENDING" ? parse(job.run_at) : null;
  if (!due || due.getTime() <= now) return null;
  return h("span", { class: "runs-in muted", title: stamp(due) }, `runs in ${span((due.getTime() - now) / 1000)}`);
}

/** A JSON value, pretty-printed, as text in a <pre> (focusable, as it may scroll). */
export function jsonBlock(value, label, id) {
  const text = value === undefined ? "—" : JSON.stringify(value, null, 2);
  return h("pre", { class: "json", tabindex: "0", "aria-label": label, id }, text);
}

export function countCell(n) {
  return h("td", { class: n ? "num" : "num count-zero" }, num(n));
}
