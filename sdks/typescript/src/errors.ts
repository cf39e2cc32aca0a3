// Errors of the SDK.
//
// Calls that fail throw an `EvoraError`: an `EvoraHTTPError` when a service answered with an
// RFC 9457 problem, an `EvoraConnectionError` when no answer arrived (refused, broken, or
// timed out). HTTP errors are mapped to a subclass by the problem's stable `code` first and
// by the HTTP status second, so `instanceof JobNotFoundError` keeps working even when a
// proxy in between answers without a problem body, and `instanceof ConflictError` catches
// every 409.
//
// Handlers throw `NonRetryableError` (or any error with `retryable === false`) to fail a job
// without retrying it. A job's `AbortSignal` is aborted with a `JobCancelledError`,
// `WorkerShutdownError` or `LeaseLostError` as its reason.

/** A call to an Evora service did not succeed. `attempts` is how many times it was sent. */
export class EvoraError extends Error {
  attempts: number;

  constructor(message: string, options?: { cause?: unknown; attempts?: number }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.attempts = options?.attempts ?? 1;
  }
}

/**
 * No HTTP answer: the connection failed, broke, or the call timed out (`timedOut`).
 * `requestSent` is false only when the request certainly never reached the server, which
 * makes even a non-idempotent call safe to repeat.
 */
export class EvoraConnectionError extends EvoraError {
  readonly requestSent: boolean;
  readonly timedOut: boolean;

  constructor(message: string, options: { cause?: unknown; requestSent: boolean; timedOut?: boolean }) {
    super(message, { cause: options.cause });
    this.requestSent = options.requestSent;
    this.timedOut = options.timedOut ?? false;
  }
}

/** One entry of a validation problem's `errors`. */
export interface ProblemLocation {
  loc?: Array<string | number>;
  msg?: string;
  type?: string;
}

export interface ProblemFields {
  code: string;
  title: string;
  detail: string | null;
  type: string;
  errors: ProblemLocation[];
  body: unknown;
}

/** The service answered with an error status; the members of its problem body are kept. */
export class EvoraHTTPError extends EvoraError {
  /** The problem code this class stands for (null: any). */
  static readonly problemCode: string | null = null;
  /** The HTTP status this class stands for (null: any). */
  static readonly problemStatus: number | null = null;

  readonly status: number;
  readonly code: string;
  readonly title: string;
  readonly detail: string | null;
  readonly type: string;
  /** The `[{loc, msg}]` of a validation problem; empty otherwise. */
  readonly errors: ProblemLocation[];
  /** The whole decoded problem (null when the body was not JSON). */
  readonly body: unknown;

  constructor(status: number, fields: ProblemFields) {
    super(`${status} ${fields.code}: ${fields.detail ?? fields.title}`);
    this.status = status;
    this.code = fields.code;
    this.title = fields.title;
    this.detail = fields.detail;
    this.type = fields.type;
    this.errors = fields.errors;
    this.body = fields.body;
  }
}

export class BadRequestError extends EvoraHTTPError {
  static override readonly problemStatus: number | null = 400;
}
export class MalformedJSONError extends BadRequestError {
  static override readonly problemCode: string | null = "malformed_json";
}
/** The token is missing or unknown. */
export class UnauthorizedError extends EvoraHTTPError {
  static override readonly problemCode: string | null = "unauthorized";
  static override readonly problemStatus: number | null = 401;
}
/** The token's role may not call this endpoint. */
export class ForbiddenError extends EvoraHTTPError {
  static override readonly problemCode: string | null = "forbidden";
  static override readonly problemStatus: number | null = 403;
}
export class NotFoundError extends EvoraHTTPError {
  static override readonly problemStatus: number | null = 404;
}
export class JobNotFoundError extends NotFoundError {
  static override readonly problemCode: string | null = "job_not_found";
}
export class QueueNotFoundError extends NotFoundError {
  static override readonly problemCode: string | null = "queue_not_found";
}
export class ScheduleNotFoundError extends NotFoundError {
  static override readonly problemCode: string | null = "schedule_not_found";
}
export class LimitNotFoundError extends NotFoundError {
  static override readonly problemCode: string | null = "limit_not_found";
}
export class CallbackNotFoundError extends NotFoundError {
  static override readonly problemCode: string | null = "callback_not_found";
}
export class ConflictError extends EvoraHTTPError {
  static override readonly problemStatus: number | null = 409;
}
/** The callback timed out, or its job was cancelled: it can no longer be resolved. */
export class CallbackSettledError extends ConflictError {
  static override readonly problemCode: string | null = "callback_settled";
}
/** The lease token is no longer the job's current lease: another attempt owns the job. */
export class LeaseLostError extends ConflictError {
  static override readonly problemCode: string | null = "lease_lost";
}
/** The job is not in a state that allows the operation. */
export class InvalidStateError extends ConflictError {
  static override readonly problemCode: string | null = "invalid_state";
}
/** The idempotency key was already used for the queue with different fields. */
export class IdempotencyConflictError extends ConflictError {
  static override readonly problemCode: string | null = "idempotency_conflict";
}
/** The idempotency key was used, but retention has since removed its job. */
export class IdempotentJobGoneError extends ConflictError {
  static override readonly problemCode: string | null = "idempotent_job_gone";
}
/** A key the submission holds is at its max_pending: nothing was stored. Retry after the
 * answer's `Retry-After` seconds, or ask the key's room first (`client.room`). */
export class QueueFullError extends EvoraHTTPError {
  static override readonly problemCode: string | null = "queue_full";
  static override readonly problemStatus: number | null = 429;
}
export class PayloadTooLargeError extends EvoraHTTPError {
  static override readonly problemCode: string | null = "payload_too_large";
  static override readonly problemStatus: number | null = 413;
}
/** The request broke a rule; `errors` says where. */
export class RequestValidationError extends EvoraHTTPError {
  static override readonly problemCode: string | null = "validation_error";
  static override readonly problemStatus: number | null = 422;
}
/** Any 5xx answer. */
export class ServerError extends EvoraHTTPError {}

type ErrorClass = typeof EvoraHTTPError;

const CLASSES: ErrorClass[] = [
  BadRequestError,
  MalformedJSONError,
  UnauthorizedError,
  ForbiddenError,
  NotFoundError,
  JobNotFoundError,
  QueueNotFoundError,
  ScheduleNotFoundError,
  LimitNotFoundError,
  CallbackNotFoundError,
  CallbackSettledError,
  ConflictError,
  LeaseLostError,
  InvalidStateError,
  IdempotencyConflictError,
  IdempotentJobGoneError,
  QueueFullError,
  PayloadTooLargeError,
  RequestValidationError,
];

const BY_CODE = new Map(CLASSES.filter((c) => c.problemCode !== null).map((c) => [c.problemCode, c]));
// The most general class per status: the one that declares the status itself.
const BY_STATUS = new Map(
  CLASSES.filter((c) => Object.hasOwn(c, "problemStatus") && c.problemStatus !== null).map((c) => [
    c.problemStatus,
    c,
  ]),
);

/** The error class for an error answer: by `code`, else by status. */
export function errorClass(status: number, code: string | null): ErrorClass {
  return (
    (code !== null ? BY_CODE.get(code) : undefined) ??
    BY_STATUS.get(status) ??
    (status >= 500 ? ServerError : EvoraHTTPError)
  );
}

function stringOr(value: unknown, fallback: string): string;
function stringOr(value: unknown, fallback: null): string | null;
function stringOr(value: unknown, fallback: string | null): string | null {
  return typeof value === "string" ? value : fallback;
}

/**
 * The typed error for an error answer. Bodies that are not problem+json (a proxy's HTML
 * page, an empty 503) still give a useful error: the code falls back to the class's own
 * code or `http_<status>`.
 */
export function errorFromResponse(status: number, text: string, statusText: string): EvoraHTTPError {
  let body: unknown = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  const problem: Record<string, unknown> =
    typeof body === "object" && body !== null && !Array.isArray(body) ? (body as Record<string, unknown>) : {};
  const code = stringOr(problem.code, null);
  const cls = errorClass(status, code);
  let detail = stringOr(problem.detail, null);
  if (detail === null && Object.keys(problem).length === 0 && text) {
    detail = text.slice(0, 200).trim() || null;
  }
  const errors = Array.isArray(problem.errors)
    ? problem.errors.filter((e): e is ProblemLocation => typeof e === "object" && e !== null)
    : [];
  return new cls(status, {
    code: code ?? cls.problemCode ?? `http_${status}`,
    title: stringOr(problem.title, statusText || `HTTP ${status}`),
    detail,
    type: stringOr(problem.type, "about:blank"),
    errors,
    body,
  });
}

/**
 * Throw from a handler to fail the job without retrying it: it goes to the DLQ at once. Any
 * error with `retryable === false` has the same effect.
 */
export class NonRetryableError extends Error {
  readonly retryable = false;

  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "NonRetryableError";
  }
}

/**
 * Throw from a handler to run the job again in `seconds` (more than 0, at most 30 days)
 * without using up an attempt: the worker snoozes it (`POST /v1/jobs/{id}/snooze`,
 * docs/jobs-that-wait.md). If a cancel was requested, the job is cancelled instead.
 */
export class Snooze extends Error {
  readonly seconds: number;

  constructor(seconds: number) {
    super(`snooze for ${seconds} s`);
    this.name = "Snooze";
    this.seconds = seconds;
  }
}

/**
 * Throw from a handler when an upstream answered with a rate limit (an HTTP 429 and its
 * `Retry-After`, say): the worker fails the attempt with `retry_after` (docs/flow-control.md,
 * "Upstream retry-after"). The bucket of `limitKey` is drained for `seconds` (more than 0, at
 * most a day) for every dispatcher and worker, so no job holding the key starts before then,
 * and this job runs again then without using up an attempt. The key should be one a limit
 * governs (a concurrency or a rate): for any other key only the job waits. If a cancel was
 * requested, the job is cancelled instead.
 */
export class RetryAfter extends Error {
  readonly seconds: number;
  readonly limitKey: string;

  constructor(seconds: number, options: { limitKey: string }) {
    super(`${options.limitKey}: retry after ${seconds} s`);
    this.name = "RetryAfter";
    this.seconds = seconds;
    this.limitKey = options.limitKey;
  }
}

/** The reason a job's signal aborts when its cancellation was requested. */
export class JobCancelledError extends Error {
  constructor(jobId: string) {
    super(`cancellation of job ${jobId} was requested`);
    this.name = "JobCancelledError";
  }
}

/** The reason a job's signal aborts when its attempt ran past the job's
 * `max_duration_seconds` (docs/jobs-that-wait.md): the worker then fails the attempt with
 * error type `timeout` once the handler has ended (or after `cancelGraceMs`). */
export class JobTimeoutError extends Error {
  constructor(jobId: string) {
    super(`job ${jobId} ran past its max_duration_seconds`);
    this.name = "JobTimeoutError";
  }
}

/** The reason a job's signal aborts when the worker stops and the grace period is over. */
export class WorkerShutdownError extends Error {
  constructor(jobId: string) {
    super(`the worker is stopping: job ${jobId} is released`);
    this.name = "WorkerShutdownError";
  }
}
