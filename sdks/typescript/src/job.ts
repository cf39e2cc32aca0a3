// The job a handler receives, and how a handler's ending becomes the outcome to report.

import { JobCancelledError, JobTimeoutError } from "./errors.js";
import type { Callback, ClaimedJob, ErrorBody, Submission } from "./types.js";

/** What the worker does for `WorkerJob.suspend`: suspends the job, answers the callback id. */
export type Suspender = (timeoutSeconds: number, onTimeout: "fail" | "dlq" | "resume") => Promise<string>;

/** What the worker does for `WorkerJob.spawnChildren`: submits the children and makes the job
 * wait for them, answers their ids. */
export type Spawner = (jobs: Submission[], onDependencyFailure: "cancel" | "run" | undefined) => Promise<string[]>;

/** The longest error message the dispatcher stores. */
export const MAX_ERROR_MESSAGE = 8192;

/**
 * One claimed job, as its handler sees it. `signal` aborts when the job's cancellation was
 * requested (reason `JobCancelledError`), when the attempt ran past the job's
 * `max_duration_seconds` (`JobTimeoutError`), when the worker stops and the grace period is over
 * (`WorkerShutdownError`), or when the lease was lost to another attempt (`LeaseLostError`):
 * pass it to fetch and timers, or check `signal.aborted` between steps.
 */
export class WorkerJob<Payload = unknown> {
  readonly id: string;
  readonly queue: string;
  readonly type: string;
  readonly payload: Payload;
  readonly attempt: number;
  readonly maxAttempts: number;
  readonly leaseSeconds: number;
  /** Everything the dispatcher sent (priority, group_key, run_at, ...). */
  readonly data: Readonly<ClaimedJob>;
  readonly signal: AbortSignal;
  /** @internal */
  readonly leaseToken: string;
  private readonly controller: AbortController;
  private cancelled = false;
  private timedOut = false;
  private recorded: Record<string, unknown>;
  private recorder: ((name: string, data: unknown) => Promise<Record<string, unknown>>) | undefined;
  private progressJson: string | undefined;
  /** @internal Set by the worker. */
  suspender: Suspender | undefined;
  /** The callback id once the handler suspended the job (`suspend`). */
  callbackId: string | undefined;
  /** @internal Set by the worker. */
  spawner: Spawner | undefined;
  /** The children's ids once the handler made the job wait for them (`spawnChildren`). */
  children: string[] | undefined;

  constructor(data: ClaimedJob) {
    this.id = data.id;
    this.queue = data.queue;
    this.type = data.type;
    this.payload = data.payload as Payload;
    this.attempt = data.attempt;
    this.maxAttempts = data.max_attempts;
    this.leaseSeconds = data.lease_seconds;
    this.leaseToken = data.lease_token;
    this.data = data;
    this.recorded = { ...(data.checkpoints ?? {}) };
    this.controller = new AbortController();
    this.signal = this.controller.signal;
  }

  /** The times the job was snoozed before this run (`Snooze`): `attempt` does not count them.
   * 0 from a dispatcher that predates snooze. */
  get snoozes(): number {
    return this.data.snoozes ?? 0;
  }

  /** The callback this job waited on before this run (docs/callbacks.md): `payload` (what its
   * resolution carried), `timed_out`, `resolved_at`, `id`, ...; null if it never suspended.
   * A handler that suspends checks it first to tell a resumed run from the first one. */
  get callback(): Readonly<Callback> | null {
    return this.data.callback ?? null;
  }

  /**
   * Suspend the job on a callback (docs/callbacks.md) and answer the callback id, the
   * credential an external system resolves it with (`POST /v1/callbacks/{callback_id}`, or
   * `Client.resolveCallback`). The attempt leaves the worker at once: no heartbeats, no lease,
   * no limit slot; hand the id on and return (what the handler returns or throws afterwards is
   * dropped). The job runs again, with `callback` set, when the callback is resolved or, after
   * `timeoutSeconds` (at most 30 days), as `onTimeout` says: `fail` the attempt, `dlq`, or
   * `resume` with `callback.timed_out`. Rejects with `JobCancelledError` if a cancel was
   * requested (the job is cancelled instead) and `LeaseLostError` if the lease is gone.
   */
  async suspend(timeoutSeconds: number, onTimeout: "fail" | "dlq" | "resume" = "fail"): Promise<string> {
    if (this.suspender === undefined) throw new Error("only a job a worker runs can be suspended");
    if (this.callbackId !== undefined) throw new Error(`job ${this.id} is already suspended`);
    this.callbackId = await this.suspender(timeoutSeconds, onTimeout);
    return this.callbackId;
  }

  /**
   * Submit children (1..10,000 items as `Client.submitBatch` takes them) and make the job wait
   * for them (docs/jobs-that-wait.md), all in one transaction; answers their ids in order. The
   * attempt leaves the worker at once, uncounted: no heartbeats, no lease, no limit slot while
   * it waits; return after this (what the handler returns or throws afterwards is dropped).
   * The job runs again once every child ended, as a new run of the same attempt number, with
   * their results in `dependencyResults`; a cancelled child cancels it under
   * `onDependencyFailure: "cancel"` (undefined keeps the job's own). Rejects with
   * `JobCancelledError` if a cancel was requested (no child is submitted), `LeaseLostError` if
   * the lease is gone, and a validation error for an invalid child (none is submitted).
   */
  async spawnChildren(jobs: Submission[], onDependencyFailure?: "cancel" | "run"): Promise<string[]> {
    if (this.spawner === undefined) throw new Error("only a job a worker runs can spawn children");
    if (this.leftWorker) throw new Error(`job ${this.id} already left the worker`);
    this.children = await this.spawner(jobs, onDependencyFailure);
    return this.children;
  }

  /** Whether the attempt left the worker while its handler ran: suspended on a callback or
   * waiting for children. Then the handler's outcome is not reported. */
  get leftWorker(): boolean {
    return this.callbackId !== undefined || this.children !== undefined;
  }

  /** {job id: result} of the COMPLETED jobs this one depends on (empty without dependencies). */
  get dependencyResults(): Readonly<Record<string, unknown>> {
    return this.data.dependency_results ?? {};
  }

    /** Whether a heartbeat reported that this job's cancellation was requested. */
  get cancelRequested(): boolean {
    return this.cancelled;
  }

  /** The steps recorded with `checkpoint()`, name -> data: by earlier attempts (handed over
   * with the claim) and by this one. A handler resumes after the last step done instead of
   * repeating it (docs/jobs-that-wait.md). Empty when none. */
  get checkpoints(): Readonly<Record<string, unknown>> {
    return this.recorded;
  }

  /** Records that step `name` is done, with what it produced (any JSON value), on the job,
   * before going on: a later attempt finds it in `checkpoints`. A name recorded again
   * replaces its data. Fenced by the lease: throws `LeaseLostError` if this attempt no
   * longer holds the job, `PayloadTooLargeError` past 100 names or 1 MiB in all. */
  async checkpoint(name: string, data: unknown = null): Promise<void> {
    if (this.recorder === undefined) throw new Error("checkpoint() needs a job a worker claimed");
    this.recorded = { ...(await this.recorder(name, data)) };
  }

  /** @internal Where `checkpoint()` sends: set by the worker. */
  attach(recorder: (name: string, data: unknown) => Promise<Record<string, unknown>>): void {
    this.recorder = recorder;
  }

  /** The hard time limit of this attempt (docs/jobs-that-wait.md); null without one. */
  get maxDurationSeconds(): number | null {
    return this.data.max_duration_seconds ?? null;
  }

  /** Whether a heartbeat reported that this attempt ran past `maxDurationSeconds`: the
   * signal aborts (`JobTimeoutError`), and the worker fails the attempt with error type
   * `timeout` (retried per the job's policy) once the handler has ended. */
  get timeoutRequested(): boolean {
    return this.timedOut;
  }

  /** Report progress (any JSON value) with the next heartbeat; a newer report replaces one
   * not yet sent. Throws at once when `value` cannot be encoded as JSON. */
  progress(value: unknown): void {
    const encoded = JSON.stringify(value);
    if (encoded === undefined) throw new TypeError("progress must be a JSON value");
    this.progressJson = encoded;
  }

  /** @internal */
  takeProgress(): string | undefined {
    const progress = this.progressJson;
    this.progressJson = undefined;
    return progress;
  }

  /** @internal A heartbeat that did not arrive: send its progress with the next one. */
  restoreProgress(progress: string): void {
    this.progressJson ??= progress;
  }

  /** @internal */
  requestCancel(): void {
    this.cancelled = true;
    this.abort(new JobCancelledError(this.id));
  }

  /** @internal */
  requestTimeout(): void {
    this.timedOut = true;
    this.abort(new JobTimeoutError(this.id));
  }

  /** @internal Aborts the signal; the first reason given is the one it keeps. */
  abort(reason: Error): void {
    if (!this.signal.aborted) this.controller.abort(reason);
  }
}

/** How a worker fails an attempt it stopped past the job's `max_duration_seconds`: the error
 * type the sweeper's timeout writes too, retried per the job's policy. */
export const TIMEOUT_ERROR: Readonly<ErrorBody> = {
  message: "the attempt ran past max_duration_seconds; the worker stopped it",
  type: "timeout",
  retryable: true,
};

/** The `error` of a fail report: retryable unless the error has `retryable === false`. */
export function failureFrom(error: unknown): ErrorBody {
  const isError = error instanceof Error;
  const message = (isError ? error.message : String(error)) || (isError ? error.name : "error");
  const retryable = (error as { retryable?: unknown } | null)?.retryable;
  return {
    message: message.slice(0, MAX_ERROR_MESSAGE),
    type: isError ? error.name : typeof error,
    retryable: retryable !== false,
  };
}
