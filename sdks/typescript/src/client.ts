// `Client`: the producer and admin client of the api service.
//
// Retry safety, call by call. Any call is sent again (up to `retries` times) when the
// connection could not be established, since the server never saw it. After a broken
// connection, a timeout or a 502/503/504 the server may have acted, so a call is repeated
// only when repeating it cannot do anything twice:
// - get, events, listJobs, queues, stats, workers, failures: repeated (reads);
// - submit with an idempotency key, submitBatch when every item has one: repeated; the
//   server deduplicates and answers a repeat with 200 + the same job, so a result may say
//   `replayed` about a job this very call created;
// - submit, submitBatch without keys: not repeated, a repeat could create a second job;
// - cancel, discard: repeated. Both drive the job towards CANCELLED, which is final; when a
//   repeat finds the job already CANCELLED (the first attempt worked but its answer was
//   lost), the job is returned instead of throwing `InvalidStateError`;
// - pause, resume: repeated, they set a flag;
// - history, histories, schedules, schedule, analytics, queueAnalytics: repeated (reads);
// - putSchedule, deleteSchedule, pauseSchedule, resumeSchedule: repeated, each sets the
//   schedule to a state (a repeated delete that finds nothing resolves all the same);
// - triggerSchedule: not repeated, a repeat would make a second job;
// - setLimit, limits, limit, room, limitKeys, deleteLimit: repeated (a PUT replaces with the same limit; a
//   repeated delete that finds nothing resolves all the same);
// - setFairness, fairness, fairKeys, deleteFairness: repeated (a PUT sets the same weight, a DELETE
//   answers 204 whether or not there was one; a read);
// - retry, redrive: not repeated. Between two attempts the job can fail again and be back
//   in the DLQ, and the repeat would grant it a second fresh attempt budget.

import { RetryBackoff } from "./backoff.js";
import { InvalidStateError, LimitNotFoundError, ScheduleNotFoundError } from "./errors.js";
import type * as api from "./generated/api.js";
import { Transport } from "./http.js";
import type {
  ApiOperation,
  CallbackResolution,
  FailureList,
  Job,
  JobEvent,
  JobListQuery,
  QueuePauseState,
  QueueStats,
  RedriveRequest,
  Submission,
  SubmitOptions,
  WorkerActivity,
} from "./types.js";

export interface ClientOptions {
  /** The api service, e.g. http://127.0.0.1:8080. */
  url: string;
  /** A `producer` token (or `admin`, which may call everything). */
  token?: string;
  /** Bound of every call, in milliseconds (default 30 s). */
  timeoutMs?: number;
  /** How many more times a call may be sent when that is safe (default 3). */
  retries?: number;
  /** The wait between those attempts. */
  backoff?: RetryBackoff;
}

/** A submitted job, and whether the server answered with the existing job of the same
 * idempotency key (200 + `Idempotent-Replayed: true`) instead of creating one (201), or
 * with the job of its debounce key (which absorbed it) or throttle key
 * (docs/flow-control.md, "Debounce and throttle"). */
export interface SubmitResult {
  id: string;
  job: Job;
  replayed: boolean;
  debounced: boolean;
  throttled: boolean;
}

function submitResult(job: Job, status: number, replayedHeader = false): SubmitResult {
  const debounced = job.debounced === true;
  const throttled = job.throttled === true;
  const replayed = (status === 200 || replayedHeader) && !debounced && !throttled;
  return { id: job.id, job, replayed, debounced, throttled };
}

export interface JobPage {
  jobs: Job[];
  /** Cursor for the next page (`listJobs({after})`), null on the last one. */
  next: string | null;
}

/** The largest page the api serves. */
const MAX_PAGE = 500;

/** Every api endpoint and the method that calls it: a new endpoint in the generated types
 * fails to compile here until the client covers it. */
export const CLIENT_METHODS = {
  "GET /v1/jobs": "listJobs",
  "POST /v1/jobs": "submit",
  "POST /v1/jobs/batch": "submitBatch",
  "GET /v1/jobs/{id}": "get",
  "GET /v1/jobs/{id}/events": "events",
  "GET /v1/jobs/{id}/dependents": "dependents",
  "POST /v1/jobs/{id}/cancel": "cancel",
  "POST /v1/callbacks/{callback_id}": "resolveCallback",
  "POST /v1/jobs/{id}/resolve": "resolveJob",
  "POST /v1/jobs/{id}/retry": "retry",
  "POST /v1/jobs/{id}/discard": "discard",
  "GET /v1/queues": "queues",
  "GET /v1/queues/{queue}/stats": "stats",
  "GET /v1/queues/{queue}/failures": "failures",
  "POST /v1/queues/{queue}/pause": "pause",
  "POST /v1/queues/{queue}/resume": "resume",
  "POST /v1/queues/{queue}/redrive": "redrive",
  "GET /v1/workers": "workers",
  "GET /v1/stats/history": "histories",
  "GET /v1/stats/queues/{queue}/history": "history",
  "GET /v1/analytics": "analytics",
  "GET /v1/analytics/queues/{queue}": "queueAnalytics",
  "PUT /v1/schedules/{name}": "putSchedule",
  "GET /v1/schedules": "schedules",
  "GET /v1/schedules/{name}": "schedule",
  "DELETE /v1/schedules/{name}": "deleteSchedule",
  "POST /v1/schedules/{name}/pause": "pauseSchedule",
  "POST /v1/schedules/{name}/resume": "resumeSchedule",
  "POST /v1/schedules/{name}/trigger": "triggerSchedule",
  "PUT /v1/limits/{key}": "setLimit",
  "GET /v1/limits": "limits",
  "GET /v1/limits/{key}": "limit",
  "GET /v1/limits/{key}/keys": "limitKeys",
  "DELETE /v1/limits/{key}": "deleteLimit",
  "PUT /v1/fairness/{key}": "setFairness",
  "GET /v1/fairness/{key}": "fairness",
  "GET /v1/fairness": "fairKeys",
  "DELETE /v1/fairness/{key}": "deleteFairness",
} as const satisfies Record<ApiOperation, keyof Client>;

function segment(value: string): string {
  return encodeURIComponent(value);
}

/** The api's client. An instance keeps the highest `Evora-Read-After` position the api
 * answered it with and sends it on every call, so that an api reading from a replica shows it
 * its own writes and never anything older than it showed it before
 * (docs/http-api.md#read-after); two instances are two clients. */
export class Client {
  private readonly http: Transport;

  constructor(options: ClientOptions) {
    this.http = new Transport(options.url, options.token, {
      timeoutMs: options.timeoutMs ?? 30_000,
      retries: options.retries ?? 3,
      backoff: options.backoff ?? new RetryBackoff(),
    });
  }

  // Producer endpoints

  /** Submit one job. Throws `IdempotencyConflictError` when `idempotency_key` was used for
   * this queue with different fields, `RequestValidationError` when a field breaks a rule. */
  async submit(queue: string, type: string, payload?: unknown, options: SubmitOptions = {}): Promise<SubmitResult> {
    const body: Submission = { ...options, queue, type };
    if (payload !== undefined) body.payload = payload;
    const resp = await this.http.request<Job>("POST", "/v1/jobs", {
      body,
      idempotent: typeof options.idempotency_key === "string",
    });
    return submitResult(resp.data, resp.status, resp.headers.get("Idempotent-Replayed") === "true");
  }

  /** Submit 1..1000 jobs in one transaction, all or nothing; results in request order. An
   * invalid item throws `RequestValidationError` (its `errors` name the index). */
  async submitBatch(jobs: Submission[]): Promise<SubmitResult[]> {
    const resp = await this.http.request<api.BatchResult>("POST", "/v1/jobs/batch", {
      body: { jobs },
      idempotent: jobs.length > 0 && jobs.every((job) => typeof job.idempotency_key === "string"),
    });
    return resp.data.jobs.map((item) => submitResult(item.job, item.status));
  }

  /** The job; `JobNotFoundError` when there is none. */
  async get(jobId: string): Promise<Job> {
    return (await this.http.request<Job>("GET", `/v1/jobs/${segment(jobId)}`, { idempotent: true })).data;
  }

  /** The job's events, oldest first. */
  async events(jobId: string): Promise<JobEvent[]> {
    const resp = await this.http.request<api.Events>("GET", `/v1/jobs/${segment(jobId)}/events`, { idempotent: true });
    return resp.data.events;
  }

  /** One page of the jobs that depend on `jobId`, in submission order; pass `page.next` as
   * `after` for the next one. `JobNotFoundError` when there is no such job. */
  async dependents(jobId: string, query: { limit?: number; after?: string } = {}): Promise<JobPage> {
    const resp = await this.http.request<api.JobList>("GET", `/v1/jobs/${segment(jobId)}/dependents`, {
      query: { ...query },
      idempotent: true,
    });
    return { jobs: resp.data.jobs, next: resp.data.next };
  }

  /** Resolve a callback a job is suspended on (docs/callbacks.md): the job runs again and its
   * handler sees `payload` in `job.callback`. Needs no token (the callback id is the
   * credential). A repeat answers the first resolution, so a retry is safe;
   * `CallbackNotFoundError` for an unknown id, `CallbackSettledError` once it timed out or its
   * job was cancelled. */
  async resolveCallback(callbackId: string, payload: unknown = null): Promise<CallbackResolution> {
    const body: api.ResolveCallbackRequest = { payload };
    return (await this.http.request<CallbackResolution>("POST", `/v1/callbacks/${segment(callbackId)}`, { body, idempotent: true })).data;
  }

  /** An admin's resolution of the callback the SUSPENDED job waits on, by the job (an
   * approval): as `resolveCallback`. */
  async resolveJob(jobId: string, payload: unknown = null): Promise<CallbackResolution> {
    const body: api.ResolveCallbackRequest = { payload };
    return (await this.http.request<CallbackResolution>("POST", `/v1/jobs/${segment(jobId)}/resolve`, { body, idempotent: true })).data;
  }

  /** Cancel a job: a PENDING, WAITING or SUSPENDED one is CANCELLED at once; a RUNNING one gets
   * `cancel_requested` and becomes CANCELLED when its worker gives it up. Final states
   * throw `InvalidStateError`. */
  async cancel(jobId: string): Promise<Job> {
    return this.toCancelled(jobId, `/v1/jobs/${segment(jobId)}/cancel`);
  }

  // Admin endpoints

  /** One page of jobs, newest first; pass `page.next` as `after` for the next one. */
  async listJobs(query: JobListQuery = {}): Promise<JobPage> {
    const resp = await this.http.request<api.JobList>("GET", "/v1/jobs", { query: { ...query }, idempotent: true });
    return { jobs: resp.data.jobs, next: resp.data.next };
  }

  /** Every job matching the filters, newest first, fetching page after page. */
  async *iterJobs(query: Omit<JobListQuery, "after"> = {}): AsyncGenerator<Job> {
    let after: string | null = null;
    do {
      const page: JobPage = await this.listJobs(after === null ? query : { ...query, after });
      yield* page.jobs;
      after = page.next;
    } while (after !== null);
  }

  /** Move a DLQ job back to PENDING with a fresh attempt budget. */
  async retry(jobId: string): Promise<Job> {
    return (await this.http.request<Job>("POST", `/v1/jobs/${segment(jobId)}/retry`, { idempotent: false })).data;
  }

  /** Move a DLQ job to CANCELLED. */
  async discard(jobId: string): Promise<Job> {
    return this.toCancelled(jobId, `/v1/jobs/${segment(jobId)}/discard`);
  }

  /** Move the queue's DLQ jobs (optionally of one type, at most `limit`) to PENDING;
   * resolves to how many moved. */
  async redrive(queue: string, filter: RedriveRequest = {}): Promise<number> {
    const resp = await this.http.request<api.Redriven>("POST", `/v1/queues/${segment(queue)}/redrive`, {
      body: filter,
      idempotent: false,
    });
    return resp.data.redriven;
  }

  /** Stop handing out the queue's jobs (submissions are still accepted). */
  async pause(queue: string): Promise<QueuePauseState> {
    return (await this.http.request<QueuePauseState>("POST", `/v1/queues/${segment(queue)}/pause`, { idempotent: true })).data;
  }

  async resume(queue: string): Promise<QueuePauseState> {
    return (await this.http.request<QueuePauseState>("POST", `/v1/queues/${segment(queue)}/resume`, { idempotent: true }))
      .data;
  }

  /** Stats of every queue, from the read models (eventually consistent), all pages. */
  async queues(): Promise<QueueStats[]> {
    const all: QueueStats[] = [];
    let after: string | null = null;
    do {
      const resp: { data: api.QueueList } = await this.http.request<api.QueueList>("GET", "/v1/queues", {
        query: { limit: MAX_PAGE, after },
        idempotent: true,
      });
      all.push(...resp.data.queues);
      after = resp.data.next;
    } while (after !== null);
    return all;
  }

  /** Read-model stats of one queue; `QueueNotFoundError` for a queue never seen. */
  async stats(queue: string): Promise<QueueStats> {
    return (await this.http.request<QueueStats>("GET", `/v1/queues/${segment(queue)}/stats`, { idempotent: true })).data;
  }

  /** The queue's recent failures, grouped by job type and error. */
  async failures(queue: string): Promise<FailureList> {
    return (await this.http.request<FailureList>("GET", `/v1/queues/${segment(queue)}/failures`, { idempotent: true })).data;
  }

  /** Workers seen recently, from the read models, all pages. */
  async workers(): Promise<WorkerActivity[]> {
    const all: WorkerActivity[] = [];
    let after: string | null = null;
    do {
      const resp: { data: api.WorkerList } = await this.http.request<api.WorkerList>("GET", "/v1/workers", {
        query: { limit: MAX_PAGE, after },
        idempotent: true,
      });
      all.push(...resp.data.workers);
      after = resp.data.next;
    } while (after !== null);
    return all;
  }

  /** The latest `evora pipeline run` (docs/http-api.md#get-v1analytics): `ran`, its `as_of`, and
   * every queue with the pipeline's totals beside the projector's and whether they `agree`,
   * all pages (the header is the last page's). */
  async analytics(): Promise<api.AnalyticsList> {
    return this.allPages<api.AnalyticsList, "queues">("/v1/analytics", "queues");
  }

  /** The latest `evora pipeline run` for each job type of `queue`
   * (docs/http-api.md#get-v1analyticsqueuesqueue): `ran`, `as_of`, and `types`, `*` (all
   * types together) first, each with its events, jobs by state, rates, latency and top
   * failure reasons, all pages. */
  async queueAnalytics(queue: string): Promise<api.QueueTypesAnalytics> {
    return this.allPages<api.QueueTypesAnalytics, "types">(`/v1/analytics/queues/${segment(queue)}`, "types");
  }

  /** A paginated answer whole: `field` from every page, the other fields from the last (a
   * pipeline run that finished while paging is the one shown). */
  private async allPages<P extends { next: string | null } & Record<F, unknown[]>, F extends string>(
    path: string,
    field: F,
  ): Promise<P> {
    const items: unknown[] = [];
    let after: string | null = null;
    let page: P;
    do {
      const resp: { data: P } = await this.http.request<P>("GET", path, { query: { limit: MAX_PAGE, after }, idempotent: true });
      page = resp.data;
      items.push(...page[field]);
      after = page.next;
    } while (after !== null);
    return { ...page, [field]: items };
  }

  /** Per-minute history of one queue (the last `minutes`, at most 1440), from the read models. */
  async history(queue: string, minutes?: number): Promise<api.QueueHistory> {
    const resp = await this.http.request<api.QueueHistory>("GET", `/v1/stats/queues/${segment(queue)}/history`, {
      query: { minutes },
      idempotent: true,
    });
    return resp.data;
  }

  /** Per-minute history of every queue, all pages. */
  async histories(minutes?: number): Promise<api.QueueHistory[]> {
    const all: api.QueueHistory[] = [];
    let after: string | null = null;
    do {
      const resp: { data: api.HistoryList } = await this.http.request<api.HistoryList>("GET", "/v1/stats/history", {
        query: { minutes, limit: MAX_PAGE, after },
        idempotent: true,
      });
      all.push(...resp.data.history);
      after = resp.data.next;
    } while (after !== null);
    return all;
  }

  // Schedules

  /** Create or replace the schedule `name`; `created` says which. A bad cron expression or
   * zone throws `RequestValidationError`. */
  async putSchedule(name: string, body: api.ScheduleBody): Promise<{ schedule: api.Schedule; created: boolean }> {
    const resp = await this.http.request<api.Schedule>("PUT", `/v1/schedules/${segment(name)}`, {
      body,
      idempotent: true,
    });
    return { schedule: resp.data, created: resp.status === 201 };
  }

  /** Every schedule, all pages. */
  async schedules(): Promise<api.Schedule[]> {
    const all: api.Schedule[] = [];
    let after: string | null = null;
    do {
      const resp: { data: api.ScheduleList } = await this.http.request<api.ScheduleList>("GET", "/v1/schedules", {
        query: { limit: MAX_PAGE, after },
        idempotent: true,
      });
      all.push(...resp.data.schedules);
      after = resp.data.next;
    } while (after !== null);
    return all;
  }

  /** The schedule with its next and last run; `ScheduleNotFoundError` when there is none. */
  async schedule(name: string): Promise<api.Schedule> {
    return (await this.http.request<api.Schedule>("GET", `/v1/schedules/${segment(name)}`, { idempotent: true })).data;
  }

  /** Delete the schedule (jobs it already made stay). */
  async deleteSchedule(name: string): Promise<void> {
    try {
      await this.http.request<unknown>("DELETE", `/v1/schedules/${segment(name)}`, { idempotent: true });
    } catch (error) {
      // A repeat after a lost answer finds the schedule already gone.
      if (!(error instanceof ScheduleNotFoundError && error.attempts > 1)) throw error;
    }
  }

  /** A paused schedule makes no jobs. */
  async pauseSchedule(name: string): Promise<api.Schedule> {
    return (await this.http.request<api.Schedule>("POST", `/v1/schedules/${segment(name)}/pause`, { idempotent: true }))
      .data;
  }

  /** Resume from the next tick (ticks that fell during the pause make nothing). */
  async resumeSchedule(name: string): Promise<api.Schedule> {
    return (await this.http.request<api.Schedule>("POST", `/v1/schedules/${segment(name)}/resume`, { idempotent: true }))
      .data;
  }

  /** Make one job of the schedule now, outside its ticks. */
  async triggerSchedule(name: string): Promise<Job> {
    return (await this.http.request<Job>("POST", `/v1/schedules/${segment(name)}/trigger`, { idempotent: false })).data;
  }

  // Limits (docs/flow-control.md)

  /** Create or replace the limit of `key` (`tenant:42`, `queue:<queue>`, or a prefix limit
   * `tenant:*` that applies to every key under it separately); `created` says which. */
  async setLimit(key: string, body: api.LimitBody): Promise<{ limit: api.Limit; created: boolean }> {
    const resp = await this.http.request<api.Limit>("PUT", `/v1/limits/${segment(key)}`, { body, idempotent: true });
    return { limit: resp.data, created: resp.status === 201 };
  }

  /** Every limit, all pages. */
  async limits(): Promise<api.Limit[]> {
    const all: api.Limit[] = [];
    let after: string | null = null;
    do {
      const resp: { data: api.LimitList } = await this.http.request<api.LimitList>("GET", "/v1/limits", {
        query: { limit: MAX_PAGE, after },
        idempotent: true,
      });
      all.push(...resp.data.limits);
      after = resp.data.next;
    } while (after !== null);
    return all;
  }

  /** The limit that governs `key` with the key's live usage; `LimitNotFoundError` when none. */
  async limit(key: string): Promise<api.LimitUsage> {
    return (await this.http.request<api.LimitUsage>("GET", `/v1/limits/${segment(key)}`, { idempotent: true })).data;
  }

  /** How many more jobs holding the concrete `key` a submission may add now under its
   * max_pending (null: none governs it). Ask before a large batch: a batch is admitted whole
   * or refused whole (`QueueFullError`); another producer may take the room meanwhile. */
  async room(key: string): Promise<number | null> {
    return (await this.limit(key)).room ?? null;
  }

  /** One page of the concrete keys the limit of `key` governs (for `tenant:*`, the keys under
   * `tenant:`), each with its usage; pass `page.next` as `after` for the next one. */
  async limitKeys(key: string, query: { limit?: number; after?: string } = {}): Promise<api.GovernedKeyPage> {
    const resp = await this.http.request<api.GovernedKeyPage>("GET", `/v1/limits/${segment(key)}/keys`, {
      query: { ...query },
      idempotent: true,
    });
    return resp.data;
  }

  /** Delete the limit of `key`. */
  async deleteLimit(key: string): Promise<void> {
    try {
      await this.http.request<unknown>("DELETE", `/v1/limits/${segment(key)}`, { idempotent: true });
    } catch (error) {
      // A repeat after a lost answer finds the limit already gone.
      if (!(error instanceof LimitNotFoundError && error.attempts > 1)) throw error;
    }
  }
  /** Set the weight of a fairness key, or of a prefix (`gold:*`: every key under it weighs
   * that much, each on its own); 0.001..1000, a key without one weighs 1
   * (docs/flow-control.md, "Fairness keys"). */
  async setFairness(key: string, weight: number): Promise<api.Weight> {
    const resp = await this.http.request<api.Weight>("PUT", `/v1/fairness/${segment(key)}`, {
      body: { weight },
      idempotent: true,
    });
    return resp.data;
  }

  /** The weight that applies to `key` (its own, a prefix's, else 1), who set it, and per
   * queue what the fair claim served it. */
  async fairness(key: string): Promise<api.KeyWeight> {
    return (await this.http.request<api.KeyWeight>("GET", `/v1/fairness/${segment(key)}`, { idempotent: true })).data;
  }

  /** The fair queues and, with `queue`, a page of its keys in key order (pass `next` as
   * `after`): each key's weight and who set it, due backlog, longest wait, and its share of
   * the held lease time against its weight's share. */
  async fairKeys(query: { queue?: string; limit?: number; after?: string } = {}): Promise<api.FairnessPage> {
    const resp = await this.http.request<api.FairnessPage>("GET", "/v1/fairness", {
      query: { ...query },
      idempotent: true,
    });
    return resp.data;
  }

  /** Drop the weight `key` set; its keys fall back to a prefix's, else 1. */
  async deleteFairness(key: string): Promise<void> {
    await this.http.request<unknown>("DELETE", `/v1/fairness/${segment(key)}`, { idempotent: true });
  }


  private async toCancelled(jobId: string, path: string): Promise<Job> {
    try {
      return (await this.http.request<Job>("POST", path, { idempotent: true })).data;
    } catch (error) {
      // A repeat after a lost answer finds the job already moved by the first attempt.
      if (error instanceof InvalidStateError && error.attempts > 1) {
        const job = await this.get(jobId);
        if (job.state === "CANCELLED") return job;
      }
      throw error;
    }
  }
}
