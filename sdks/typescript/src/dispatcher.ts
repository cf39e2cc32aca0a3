// `DispatcherClient`: the worker API of the dispatcher, call by call. `Worker` is built on
// it; use it directly only for workers that manage claims and leases themselves.
//
// Every claim issues a new lease token. Heartbeat, complete, fail and release with a token
// that is not the job's current lease throw `LeaseLostError` (409 lease_lost) and change
// nothing. Complete, fail, release and acks are repeated after a lost answer: repeating a
// complete with the same token returns the same job, and repeating the others finds the
// lease gone and changes nothing. Claims are never repeated: a repeat after a lost answer
// would claim other jobs while the first ones wait for their leases to expire.

import { RetryBackoff } from "./backoff.js";
import type * as dispatcher from "./generated/dispatcher.js";
import { EvoraError } from "./errors.js";
import { Transport } from "./http.js";
import type {
  AckItem,
  AckResult,
  ClaimRequest,
  ClaimedJob,
  DispatchedJob,
  DispatcherOperation,
  ErrorBody,
  HeartbeatResponse,
  RetryAfterBody,
  Submission,
} from "./types.js";

export interface DispatcherClientOptions {
  /** The dispatcher, e.g. http://127.0.0.1:8081. */
  url: string;
  /** A `worker` token. */
  token?: string;
  /** Bound of every call but a claim's long-poll (which gets `wait_seconds` more), ms. */
  timeoutMs?: number;
  retries?: number;
  backoff?: RetryBackoff;
}

export interface CallOptions {
  signal?: AbortSignal;
  timeoutMs?: number;
  retries?: number;
}

/** Every dispatcher endpoint and the method that calls it (checked like `CLIENT_METHODS`). */
export const DISPATCHER_METHODS = {
  "POST /v1/claim": "claim",
  "POST /v1/jobs/{id}/heartbeat": "heartbeat",
  "POST /v1/jobs/{id}/complete": "complete",
  "POST /v1/jobs/{id}/fail": "fail",
  "POST /v1/jobs/{id}/release": "release",
  "POST /v1/jobs/{id}/snooze": "snooze",
  "POST /v1/jobs/{id}/checkpoints": "checkpoint",
  "POST /v1/jobs/{id}/suspend": "suspend",
  "POST /v1/jobs/{id}/children": "spawnChildren",
  "POST /v1/acks": "acks",
} as const satisfies Record<DispatcherOperation, keyof DispatcherClient>;

function jobPath(jobId: string, action: string): string {
  return `/v1/jobs/${encodeURIComponent(jobId)}/${action}`;
}

export class DispatcherClient {
  readonly timeoutMs: number;
  private readonly http: Transport;

  constructor(options: DispatcherClientOptions) {
    this.timeoutMs = options.timeoutMs ?? 10_000;
    this.http = new Transport(options.url, options.token, {
      timeoutMs: this.timeoutMs,
      retries: options.retries ?? 3,
      backoff: options.backoff ?? new RetryBackoff(),
    });
  }

  /** Long-polls for up to `max_jobs` jobs; resolves with none after `wait_seconds`. */
  async claim(request: ClaimRequest, options: CallOptions = {}): Promise<ClaimedJob[]> {
    const waitMs = (request.wait_seconds ?? 20) * 1000;
    const resp = await this.http.request<dispatcher.ClaimResponse>("POST", "/v1/claim", {
      body: request,
      idempotent: false,
      retries: 0,
      timeoutMs: waitMs + (options.timeoutMs ?? this.timeoutMs),
      ...(options.signal ? { signal: options.signal } : {}),
    });
    return resp.data.jobs;
  }

  /** Whether the dispatcher answers `GET /readyz` with 200 (one attempt, `timeoutMs` bound). */
  async ready(options: CallOptions = {}): Promise<boolean> {
    try {
      await this.http.request<unknown>("GET", "/readyz", {
        idempotent: true,
        retries: 0,
        timeoutMs: options.timeoutMs ?? this.timeoutMs,
        ...(options.signal ? { signal: options.signal } : {}),
      });
      return true;
    } catch (error) {
      if (error instanceof EvoraError) return false;
      throw error;
    }
  }

  /** Extends the lease; `progress` is any JSON value already encoded as JSON text. */
  async heartbeat(
    jobId: string,
    leaseToken: string,
    extra: { leaseSeconds?: number; progressJson?: string } = {},
    options: CallOptions = {},
  ): Promise<HeartbeatResponse> {
    let raw = `{"lease_token":${JSON.stringify(leaseToken)}`;
    if (extra.leaseSeconds !== undefined) raw += `,"lease_seconds":${JSON.stringify(extra.leaseSeconds)}`;
    if (extra.progressJson !== undefined) raw += `,"progress":${extra.progressJson}`;
    raw += "}";
    const resp = await this.http.request<HeartbeatResponse>("POST", jobPath(jobId, "heartbeat"), {
      raw,
      idempotent: true,
      ...options,
    });
    return resp.data;
  }

  /** Completes the job with `result` (any JSON value). */
  async complete(jobId: string, leaseToken: string, result?: unknown, options: CallOptions = {}): Promise<DispatchedJob> {
    const body: dispatcher.CompleteRequest = { lease_token: leaseToken };
    if (result !== undefined) body.result = result;
    return this.post(jobPath(jobId, "complete"), body, options);
  }

  /** Fails the job: retried later while attempts remain and `error.retryable` is not false.
   * With `retryAfter` (an upstream's rate limit) the key's bucket is drained for its seconds
   * and the job runs again then without using up an attempt (docs/flow-control.md). */
  async fail(
    jobId: string,
    leaseToken: string,
    error: ErrorBody,
    retryInSeconds?: number,
    options: CallOptions = {},
    retryAfter?: RetryAfterBody,
  ): Promise<DispatchedJob> {
    const body: dispatcher.FailRequest = { lease_token: leaseToken, error };
    if (retryInSeconds !== undefined) body.retry_in_seconds = retryInSeconds;
    if (retryAfter !== undefined) body.retry_after = retryAfter;
    return this.post(jobPath(jobId, "fail"), body, options);
  }

  /** Hands the job back (PENDING) without using up an attempt. */
  async release(jobId: string, leaseToken: string, delaySeconds?: number, options: CallOptions = {}): Promise<DispatchedJob> {
    const body: dispatcher.ReleaseRequest = { lease_token: leaseToken };
    if (delaySeconds !== undefined) body.delay_seconds = delaySeconds;
    return this.post(jobPath(jobId, "release"), body, options);
  }

  /** Runs the job again in `delaySeconds` without using up an attempt (event `snoozed`). */
  async snooze(jobId: string, leaseToken: string, delaySeconds: number, options: CallOptions = {}): Promise<DispatchedJob> {
    const body: dispatcher.SnoozeRequest = { lease_token: leaseToken, delay_seconds: delaySeconds };
    return this.post(jobPath(jobId, "snooze"), body, options);
  }

  /** Records step `name` of the job with what it produced (event `checkpointed`): handed to
   * the job's next attempt with its claim. Fenced by the lease (409 `LeaseLostError`); 413
   * past 100 names or 1 MiB in all. Answers every checkpoint of the job. */
  async checkpoint(
    jobId: string,
    leaseToken: string,
    name: string,
    data: unknown,
    options: CallOptions = {},
  ): Promise<Record<string, unknown>> {
    const body: dispatcher.CheckpointRequest = { lease_token: leaseToken, name, data };
    const resp = await this.http.request<dispatcher.CheckpointResponse>("POST", jobPath(jobId, "checkpoints"), {
      body,
      // the same name and data again stores the same: safe to repeat
      idempotent: true,
      ...options,
    });
    return resp.data.checkpoints;
  }

  /** Suspends the job on a callback (docs/callbacks.md): it holds no lease until the callback
   * is resolved or times out. Answers the one-time callback id (null when a requested cancel
   * won) and the job. Not retried: a repeat finds the attempt over (409). */
  async suspend(
    jobId: string,
    leaseToken: string,
    timeoutSeconds: number,
    onTimeout: "fail" | "dlq" | "resume" = "fail",
    options: CallOptions = {},
  ): Promise<dispatcher.SuspendResponse> {
    const body: dispatcher.SuspendRequest = { lease_token: leaseToken, timeout_seconds: timeoutSeconds, on_timeout: onTimeout };
    return (
      await this.http.request<dispatcher.SuspendResponse>("POST", jobPath(jobId, "suspend"), { body, idempotent: false, ...options })
    ).data;
  }

  /** Submits the job's children and makes it wait for them (docs/jobs-that-wait.md): it holds
   * no lease until they all ended. Answers the job and the children's ids (none when a
   * requested cancel won). Not retried: a repeat finds the attempt over (409). */
  async spawnChildren(
    jobId: string,
    leaseToken: string,
    jobs: Submission[],
    onDependencyFailure?: "cancel" | "run",
    options: CallOptions = {},
  ): Promise<dispatcher.ChildrenResponse> {
    const body: dispatcher.ChildrenRequest = { lease_token: leaseToken, jobs };
    if (onDependencyFailure !== undefined) body.on_dependency_failure = onDependencyFailure;
    return (
      await this.http.request<dispatcher.ChildrenResponse>("POST", jobPath(jobId, "children"), { body, idempotent: false, ...options })
    ).data;
  }

  /** Records up to 1000 outcomes at once; each gets its own status (200, 404 or 409). `raw`
   * items are the JSON text of `AckItem`s. */
  async acks(items: AckItem[] | { raw: string[] }, options: CallOptions = {}): Promise<AckResult[]> {
    const raw = Array.isArray(items) ? undefined : `{"acks":[${items.raw.join(",")}]}`;
    const resp = await this.http.request<dispatcher.AcksResponse>("POST", "/v1/acks", {
      ...(raw === undefined ? { body: { acks: items } } : { raw }),
      idempotent: true,
      ...options,
    });
    return resp.data.results;
  }

  private async post(path: string, body: unknown, options: CallOptions): Promise<DispatchedJob> {
    return (await this.http.request<DispatchedJob>("POST", path, { body, idempotent: true, ...options })).data;
  }
}
