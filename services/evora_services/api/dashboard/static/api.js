// Calls to the api this page was served by, with the admin token as a Bearer header.
// The token lives in sessionStorage (this tab only) and is never put in a cookie or a URL.

const TOKEN_KEY = "evora.admin-token";

export class ApiError extends Error {
  constructor(status, problem) {
    const detail = problem && (problem.detail || problem.title);
    super(detail ? `${detail} (HTTP ${status})` : `HTTP ${status}`);
    this.status = status;
    this.code = problem && problem.code;
    this.title = problem && problem.title;
  }
}

export function getToken() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
}

export function clearToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

/** "/v1/jobs" + {queue: "a", state: ""} -> "/v1/jobs?queue=a" (empty values left out) */
export function withQuery(path, params) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== undefined && value !== null && value !== "") query.set(key, String(value));
  }
  const text = query.toString();
  return text ? `${path}?${text}` : path;
}

export function seg(value) {
  return encodeURIComponent(value);
}

/**
 * fetch + JSON + problem details. A 401 while signed in means the token stopped working:
 * the app hears about it through the "evora:unauthorized" event and shows the sign-in.
 */
export async function api(path, { method = "GET", body, token } = {}) {
  const headers = { Accept: "application/json" };
  const bearer = token === undefined ? getToken() : token;
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  const init = { method, headers, cache: "no-store", credentials: "omit", redirect: "error" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  let data = null;
  const type = response.headers.get("Content-Type") || "";
  if (type.includes("json")) {
    try {
      data = await response.json();
    } catch {
      data = null;
    }
  }
  if (!response.ok) {
    const error = new ApiError(response.status, data);
    if (response.status === 401 && token === undefined) {
      window.dispatchEvent(new CustomEvent("evora:unauthorized", { detail: error }));
    }
    throw error;
  }
  return data;
}

// The most items a list endpoint serves per page.
const PAGE_MAX = 500;

/** Every item of a keyset-paginated list (`member` of each page), following `next`. */
export async function apiAll(path, member, params = {}) {
  const items = [];
  let after;
  do {
    const page = await api(withQuery(path, { ...params, limit: PAGE_MAX, after }));
    items.push(...page[member]);
    after = page.next;
  } while (after);
  return items;
}
