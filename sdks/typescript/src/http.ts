// HTTP plumbing shared by `Client` and `Worker`: the platform's fetch, JSON bodies, a
// timeout on every call (AbortSignal.timeout), typed errors, and retries only where safe.
//
// Whether a call may be repeated is the caller's decision (`idempotent`); this module only
// knows which failures are worth repeating:
// - the connection could not be established: the server never saw the request, so any
//   call may be repeated;
// - the connection broke or timed out after the request was sent, or a gateway answered
//   502/503/504: the server may have acted on it, so only idempotent calls are repeated;
// - any other answer (4xx, 500) is final: repeating it would get the same answer.

import { RetryBackoff, sleep } from "./backoff.js";
import { EvoraConnectionError, EvoraError, EvoraHTTPError, errorFromResponse } from "./errors.js";

export const RETRYABLE_STATUSES: ReadonlySet<number> = new Set([502, 503, 504]);

// Error codes of a connection that was never established (the request was not sent).
const NOT_CONNECTED = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENETUNREACH"]);

/** Whether a call that failed with `error` may be sent again (see the module comment). */
export function shouldRetry(error: unknown, idempotent: boolean): boolean {
  if (error instanceof EvoraConnectionError) return idempotent || !error.requestSent;
  if (error instanceof EvoraHTTPError) return idempotent && RETRYABLE_STATUSES.has(error.status);
  return false;
}

export interface Response<T> {
  status: number;
  headers: Headers;
  data: T;
}

export interface RequestOptions {
  /** A value sent as JSON, or `raw`: JSON text already encoded. */
  body?: unknown;
  raw?: string;
  query?: Record<string, string | number | null | undefined>;
  idempotent: boolean;
  /** Replaces the transport's timeout for each attempt. */
  timeoutMs?: number;
  /** Replaces the transport's number of retries. */
  retries?: number;
  /** Aborts the call (and its retries); the call then rejects with the signal's reason. */
  signal?: AbortSignal;
}

export interface TransportOptions {
  timeoutMs: number;
  retries: number;
  backoff: RetryBackoff;
  onRetry?: (method: string, path: string, error: EvoraError, delayMs: number) => void;
}

function codeOf(error: unknown): string | undefined {
  // undici reports the socket's error as the cause of its "fetch failed" TypeError.
  for (let e: unknown = error; typeof e === "object" && e !== null; e = (e as { cause?: unknown }).cause) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string") return code;
  }
  return undefined;
}

/**
 * A signal that aborts when either `a` or `b` does; `unlink()` detaches it once the call is
 * over. Not `AbortSignal.any`: on Node 20 every signal it makes stays referenced by a
 * long-lived input (the worker's stop signal), about 2 KB leaked per request.
 */
export function linkSignals(a: AbortSignal, b: AbortSignal): { signal: AbortSignal; unlink: () => void } {
  const controller = new AbortController();
  const abort = (event: Event): void => controller.abort((event.target as AbortSignal).reason);
  const unlink = (): void => {
    a.removeEventListener("abort", abort);
    b.removeEventListener("abort", abort);
  };
  for (const input of [a, b]) {
    if (input.aborted) {
      controller.abort(input.reason);
      return { signal: controller.signal, unlink: () => {} };
    }
  }
  a.addEventListener("abort", abort, { once: true });
  b.addEventListener("abort", abort, { once: true });
  return { signal: controller.signal, unlink };
}

/** The header a client sends back its highest position with (docs/http-api.md#read-after). */
export const READ_AFTER_HEADER = "Evora-Read-After";
const POSITION = /^([0-9A-Fa-f]{1,8})\/([0-9A-Fa-f]{1,8})$/;

/** The position an `Evora-Read-After` value names (a PostgreSQL LSN), or undefined. 64 bits:
 * a bigint, since a number would lose the low digits of a large one. */
export function parsePosition(text: string): bigint | undefined {
  const match = POSITION.exec(text.trim());
  if (!match) return undefined;
  return (BigInt(`0x${match[1]}`) << 32n) | BigInt(`0x${match[2]}`);
}

export function formatPosition(position: bigint): string {
  const upper = (position >> 32n).toString(16).toUpperCase();
  const lower = (position & 0xffffffffn).toString(16).toUpperCase();
  return `${upper}/${lower}`;
}

/** One base URL and one token. It keeps the highest `Evora-Read-After` position any answer
 * carried and sends it with every request, so that an api reading from a replica shows this
 * client its own writes and never anything older than it showed it before. */
export class Transport {
  readonly baseUrl: string;
  private readonly headers: Record<string, string>;
  private readonly options: TransportOptions;
  /** The highest position seen; 0n: none yet. */
  readAfter = 0n;

  constructor(url: string, token: string | undefined, options: TransportOptions) {
    if (!(options.timeoutMs > 0) || options.retries < 0) {
      throw new RangeError("timeoutMs must be positive and retries not negative");
    }
    this.baseUrl = url.replace(/\/+$/, "");
    this.headers = { Accept: "application/json, application/problem+json" };
    if (token) this.headers.Authorization = `Bearer ${token}`;
    this.options = options;
  }

  /** Send a request, retrying as `shouldRetry` allows; rejects with an `EvoraError`. */
  async request<T>(method: string, path: string, options: RequestOptions): Promise<Response<T>> {
    const payload = options.raw ?? (options.body === undefined ? undefined : JSON.stringify(options.body));
    const maxRetries = options.retries ?? this.options.retries;
    const url = this.url(path, options.query);
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.sendOnce<T>(method, url, path, payload, options);
      } catch (error) {
        if (!(error instanceof EvoraError)) throw error;
        error.attempts = attempt;
        if (attempt > maxRetries || !shouldRetry(error, options.idempotent)) throw error;
        const delay = this.options.backoff.delay(attempt);
        this.options.onRetry?.(method, path, error, delay);
        await sleep(delay, options.signal);
      }
    }
  }

  private url(path: string, query: RequestOptions["query"]): string {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(query ?? {})) {
      if (value !== undefined && value !== null) params.set(name, String(value));
    }
    const search = params.toString();
    return `${this.baseUrl}${path}${search ? `?${search}` : ""}`;
  }

  private async sendOnce<T>(
    method: string,
    url: string,
    path: string,
    payload: string | undefined,
    options: RequestOptions,
  ): Promise<Response<T>> {
    // AbortSignal.timeout takes whole milliseconds only.
    const timeout = AbortSignal.timeout(Math.ceil(options.timeoutMs ?? this.options.timeoutMs));
    const linked = options.signal ? linkSignals(timeout, options.signal) : { signal: timeout, unlink: () => {} };
    const { signal } = linked;
    const headers: Record<string, string> = { ...this.headers };
    if (payload !== undefined) headers["Content-Type"] = "application/json";
    if (this.readAfter > 0n) headers[READ_AFTER_HEADER] = formatPosition(this.readAfter);
    let status: number;
    let statusText: string;
    let responseHeaders: Headers;
    let text: string;
    try {
      const response = await fetch(url, { method, headers, body: payload ?? null, signal });
      ({ status, statusText } = response);
      responseHeaders = response.headers;
      text = await response.text();
    } catch (error) {
      linked.unlink();
      if (options.signal?.aborted) throw options.signal.reason;
      if (timeout.aborted) {
        throw new EvoraConnectionError(`${method} ${path}: no answer within the timeout`, {
          cause: error,
          requestSent: true,
          timedOut: true,
        });
      }
      const code = codeOf(error);
      if (code !== undefined && NOT_CONNECTED.has(code)) {
        throw new EvoraConnectionError(`cannot connect to ${this.baseUrl}: ${code}`, {
          cause: error,
          requestSent: false,
        });
      }
      throw new EvoraConnectionError(`${method} ${path}: no answer (${code ?? String(error)})`, {
        cause: error,
        requestSent: true,
      });
    }
    linked.unlink();
    const position = parsePosition(responseHeaders.get(READ_AFTER_HEADER) ?? "");
    if (position !== undefined && position > this.readAfter) this.readAfter = position;
    if (status >= 400) throw errorFromResponse(status, text, statusText);
    let data: unknown = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch (error) {
        throw new EvoraError(`${method} ${path}: the answer is not JSON`, { cause: error });
      }
    }
    return { status, headers: responseHeaders, data: data as T };
  }
}
