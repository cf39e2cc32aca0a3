// Turning api values into text (and a few small elements). Everything returns text or
// nodes built with h(): nothing here parses markup.

import { h } from "./dom.js";

export const STATES = ["PENDING", "RUNNING", "COMPLETED", "DLQ", "CANCELLED"];
export const STATE_TITLES = { PENDING: "Pending", RUNNING: "Running", COMPLETED: "Completed", DLQ: "DLQ", CANCELLED: "Cancelled" };

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

/** A <time> element (full UTC timestamp on hover), or an em dash for null. */
export function time(iso) {
  const date = parse(iso);
  if (!date) return h("span", { class: "muted" }, "—");
  return h("time", { datetime: date.toISOString(), title: date.toISOString() }, clock(date));
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

/** "12 s ago" / "in 5 s" with the timestamp on hover. */
export function ago(iso, now = Date.now()) {
  const date = parse(iso);
  if (!date) return h("span", { class: "muted" }, "—");
  const seconds = (now - date.getTime()) / 1000;
  const text = seconds >= 0 ? `${span(seconds)} ago` : `in ${span(-seconds)}`;
  return h("time", { datetime: date.toISOString(), title: date.toISOString() }, text);
}

export function num(value) {
  if (value === null || value === undefined) return "—";
  return Number(value).toLocaleString("en-US", { maximumFractionDigits: 1 });
}

export function rate(value) {
  const n = Number(value || 0);
  return n >= 100 ? n.toFixed(0) : n.toFixed(1);
}

/** Milliseconds as "850 ms", "1.2 s", "3.4 min". */
export function ms(value) {
  const n = Number(value || 0);
  if (n < 1000) return `${Math.round(n)} ms`;
  if (n < 60_000) return `${(n / 1000).toFixed(1)} s`;
  if (n < 3_600_000) return `${(n / 60_000).toFixed(1)} min`;
  return `${(n / 3_600_000).toFixed(1)} h`;
}

/** The job state as text in a coloured pill: readable without the colour. */
export function stateBadge(state) {
  return h("span", { class: `state state-${STATES.includes(state) ? state : "other"}` }, state);
}

export function pausedBadge(paused) {
  return paused
    ? h("span", { class: "state state-paused" }, "‖ Paused")
    : h("span", { class: "state state-active" }, "▶ Active");
}

export function shortId(id) {
  return String(id).slice(0, 8);
}

/** A JSON value, pretty-printed, as text in a <pre> (focusable, as it may scroll). */
export function jsonBlock(value, label, id) {
  const text = value === undefined ? "—" : JSON.stringify(value, null, 2);
  return h("pre", { class: "json", tabindex: "0", "aria-label": label, id }, text);
}

export function countCell(n) {
  return h("td", { class: n ? "num" : "num count-zero" }, num(n));
}
