// The dashboard's entry point: sign-in, the hash router, auto-refresh and the "as of" line.

import { api, ApiError, clearToken, getToken, setToken } from "./api.js";
import { analytics, analyticsQueue } from "./analytics.js";
import { h, replace } from "./dom.js";
import { clock, span, secondsSince } from "./format.js";
import * as dlq from "./dlq.js";
import { fairKeys, fairness } from "./fairness.js";
import * as job from "./job.js";
import { limitKeys, limits } from "./limits.js";
import * as overview from "./overview.js";
import * as queue from "./queue.js";
import * as schedules from "./schedules.js";
import * as workers from "./workers.js";

const INTERVAL_KEY = "evora.refresh-seconds";
const DEFAULT_INTERVAL = "5";

const $ = (id) => document.getElementById(id);

const ui = {
  login: $("login"),
  loginForm: $("login-form"),
  loginToken: $("login-token"),
  loginError: $("login-error"),
  shell: $("shell"),
  main: $("main"),
  status: $("status"),
  asOf: $("as-of"),
  lag: $("lag"),
  interval: $("refresh-interval"),
  refreshNow: $("refresh-now"),
  logout: $("logout"),
};

// -- messages ------------------------------------------------------------------------

let statusTimer = null;

/** A message in the status line (read out by screen readers). */
function announce(text, { error = false } = {}) {
  ui.status.classList.toggle("error", error);
  ui.status.setAttribute("role", error ? "alert" : "status");
  ui.status.textContent = text;
  clearTimeout(statusTimer);
  if (!error) statusTimer = setTimeout(() => (ui.status.textContent = ""), 8000);
}

function describe(error) {
  if (error instanceof ApiError) return error.message;
  if (error instanceof TypeError) return `the api could not be reached (${error.message})`;
  return String(error && error.message ? error.message : error);
}

// -- sign-in -------------------------------------------------------------------------

function showLogin(message = "") {
  stopView();
  ui.shell.hidden = true;
  ui.login.hidden = false;
  ui.loginError.textContent = message;
  ui.loginToken.value = "";
  ui.loginToken.setAttribute("aria-invalid", message ? "true" : "false");
  document.title = "Sign in · Evora dashboard";
  ui.loginToken.focus();
}

function showShell() {
  ui.login.hidden = true;
  ui.shell.hidden = false;
  route();
}

async function signIn(event) {
  event.preventDefault();
  const token = ui.loginToken.value.trim();
  if (!token) {
    ui.loginError.textContent = "Enter the admin token.";
    ui.loginToken.setAttribute("aria-invalid", "true");
    ui.loginToken.focus();
    return;
  }
  const button = ui.loginForm.querySelector("button[type=submit]");
  button.disabled = true;
  ui.loginError.textContent = "";
  try {
    // An admin-only endpoint that needs no read models: it tells a wrong token (401) from
    // a token of another role (403).
    await api("/v1/jobs?limit=1", { token });
    setToken(token);
    showShell();
  } catch (error) {
    let message;
    if (error instanceof ApiError && error.status === 401) {
      message = "That token was not accepted (401 Unauthorized). Check the admin token and try again.";
    } else if (error instanceof ApiError && error.status === 403) {
      message = "That token is valid but is not an admin token (403 Forbidden). The dashboard needs a token with the admin role.";
    } else {
      message = `Could not sign in: ${describe(error)}.`;
    }
    ui.loginError.textContent = message;
    ui.loginToken.setAttribute("aria-invalid", "true");
    ui.loginToken.select();
    ui.loginToken.focus();
  } finally {
    button.disabled = false;
  }
}

function signOut() {
  clearToken();
  location.hash = "#/";
  showLogin("");
}

window.addEventListener("evora:unauthorized", () => {
  clearToken();
  showLogin("The api no longer accepts this token (401 Unauthorized). Sign in again.");
});

// -- routing -------------------------------------------------------------------------

const VIEWS = { overview, queue, job, dlq, workers, schedules, limits, limitKeys, fairness, fairKeys, analytics, analyticsQueue };

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const cut = raw.indexOf("?");
  const path = cut < 0 ? raw : raw.slice(0, cut);
  const params = Object.fromEntries(new URLSearchParams(cut < 0 ? "" : raw.slice(cut + 1)));
  let parts;
  try {
    parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  } catch {
    return { name: "notFound", params };
  }
  if (parts.length === 0) return { name: "overview", params };
  if (parts[0] === "queues" && parts.length === 2) return { name: "queue", params: { ...params, queue: parts[1] } };
  if (parts[0] === "jobs" && parts.length === 2) return { name: "job", params: { ...params, id: parts[1] } };
  if (parts[0] === "dlq" && parts.length === 1) return { name: "dlq", params };
  if (parts[0] === "workers" && parts.length === 1) return { name: "workers", params };
  if (parts[0] === "schedules" && parts.length === 1) return { name: "schedules", params };
  if (parts[0] === "limits" && parts.length === 1) return { name: "limits", params };
  if (parts[0] === "limits" && parts.length === 2) return { name: "limitKeys", params: { ...params, key: parts[1] } };
  if (parts[0] === "fairness" && parts.length === 1) return { name: "fairness", params };
  if (parts[0] === "fairness" && parts.length === 2) return { name: "fairKeys", params: { ...params, queue: parts[1] } };
  if (parts[0] === "analytics" && parts.length === 1) return { name: "analytics", params };
  if (parts[0] === "analytics" && parts.length === 2) return { name: "analyticsQueue", params: { ...params, queue: parts[1] } };
  return { name: "notFound", params };
}

let current = null; // {name, instance, errorBox, busy, startedAt}
let readModelsAsOf = null;
let lastUpdated = null;
const memory = {}; // per-view state that outlives a re-mount (e.g. pagination stacks)

function stopView() {
  if (current && current.instance.destroy) current.instance.destroy();
  current = null;
}

const ctx = {
  announce,
  describe,
  memory,
  /** views report the read models' as_of from the stats they fetched */
  setAsOf(asOf) {
    if (asOf) readModelsAsOf = asOf;
  },
  refreshNow: () => refresh(),
  navigate(hash) {
    if (location.hash === hash) refresh();
    else location.hash = hash;
  },
};

function route() {
  if (!getToken()) return;
  const focusKey = document.activeElement && document.activeElement.dataset
    ? document.activeElement.dataset.focusKey
    : undefined;
  const { name, params } = parseHash();
  const sameView = current && current.name === name;
  stopView();
  for (const link of document.querySelectorAll("[data-nav]")) {
    const active =
      link.dataset.nav === name ||
      (link.dataset.nav === "overview" && name === "queue") ||
      (link.dataset.nav === "limits" && name === "limitKeys") ||
      (link.dataset.nav === "fairness" && name === "fairKeys") ||
      (link.dataset.nav === "analytics" && name === "analyticsQueue");
    if (active) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  const errorBox = h("div", { class: "error-box", role: "alert", hidden: true });
  const body = h("div");
  replace(ui.main, errorBox, body);
  if (name === "notFound") {
    replace(body, h("h1", { tabindex: "-1" }, "Page not found"),
      h("p", null, h("a", { href: "#/" }, "Back to the queues")));
    document.title = "Not found · Evora dashboard";
    body.querySelector("h1").focus();
    return;
  }
  const instance = VIEWS[name].mount(body, params, ctx);
  document.title = `${instance.title || name} · Evora dashboard`;
  current = { name, instance, errorBox, busy: false, startedAt: 0, queue: Promise.resolve() };
  refresh().then(() => {
    const again = focusKey && ui.main.querySelector(`[data-focus-key="${CSS.escape(focusKey)}"]`);
    if (again) again.focus();
    else if (!sameView) {
      const heading = ui.main.querySelector("h1");
      if (heading) {
        heading.setAttribute("tabindex", "-1");
        heading.focus({ preventScroll: true });
      }
    }
  });
}

window.addEventListener("hashchange", route);

// -- refresh -------------------------------------------------------------------------

/** Reload the current view's data; calls made while one is running queue up behind it. */
function refresh() {
  const view = current;
  if (!view) return Promise.resolve();
  const run = () => load(view);
  view.queue = view.queue.then(run, run);
  return view.queue;
}

async function load(view) {
  if (view !== current) return;
  view.busy = true;
  view.startedAt = Date.now();
  const active = document.activeElement;
  const focusKey = active && active.dataset ? active.dataset.focusKey : undefined;
  try {
    await view.instance.refresh();
    if (view !== current) return;
    view.errorBox.hidden = true;
    view.errorBox.textContent = "";
    lastUpdated = new Date();
  } catch (error) {
    if (view !== current) return;
    if (error instanceof ApiError && error.status === 401) return; // sign-in shown
    view.errorBox.hidden = false;
    view.errorBox.textContent = `Could not load this page: ${describe(error)}`;
  } finally {
    view.busy = false;
    if (focusKey && view === current && !ui.main.contains(document.activeElement)) {
      const again = ui.main.querySelector(`[data-focus-key="${CSS.escape(focusKey)}"]`);
      if (again) again.focus({ preventScroll: true });
    }
    showAsOf();
  }
}

function showAsOf() {
  ui.asOf.textContent = lastUpdated ? `Updated ${clock(lastUpdated)}` : "Loading…";
  if (readModelsAsOf && readModelsAsOf.at) {
    const behind = secondsSince(readModelsAsOf.at);
    ui.lag.textContent = `read models at event #${readModelsAsOf.seq}, projected ${span(behind)} ago`;
    ui.lag.title = `The projector last applied events at ${readModelsAsOf.at}. It only advances when there are new events.`;
  } else {
    ui.lag.textContent = "";
  }
}

function intervalSeconds() {
  return Number(ui.interval.value) || 0;
}

function tick() {
  showAsOf();
  if (!current || current.busy || document.hidden) return;
  if (document.querySelector("dialog[open]")) return; // never change the page under a question
  const seconds = intervalSeconds();
  if (seconds > 0 && Date.now() - current.startedAt >= seconds * 1000) refresh();
}

// -- start ---------------------------------------------------------------------------

function start() {
  ui.loginForm.addEventListener("submit", signIn);
  ui.logout.addEventListener("click", signOut);
  ui.refreshNow.addEventListener("click", () => refresh());
  ui.interval.value = sessionStorage.getItem(INTERVAL_KEY) || DEFAULT_INTERVAL;
  ui.interval.addEventListener("change", () => {
    sessionStorage.setItem(INTERVAL_KEY, ui.interval.value);
    announce(intervalSeconds() ? `Auto-refresh every ${intervalSeconds()} s.` : "Auto-refresh is off.");
  });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) tick();
  });
  setInterval(tick, 1000);
  if (getToken()) showShell();
  else showLogin("");
}

start();
