// Telling the dispatcher how jobs ended. Outcomes are coalesced into `POST /v1/acks`
// requests: one flusher sends at most one batch at a time, and while a batch is in flight
// new outcomes queue up for the next one, so the batch size follows the load without any
// timer. When other handlers are still running (so more outcomes are likely within
// milliseconds) the flusher lingers up to `lingerMs` for the batch to fill; when nothing
// else runs it sends at once, so a lone job's outcome is never delayed.
//
// Each outcome may name a callback run when it is taken into a batch being sent: the worker
// frees the job's slot then, so its next claim overlaps this batch's round trip, while
// outcomes still queued keep their slots (so at most one batch is ever unsent beyond them).
//
// Sending a batch again after a lost answer is safe (a repeated complete with the same lease
// token returns the same job, a repeated fail finds the lease gone and changes nothing), so
// transient failures are retried with backoff until they succeed or `close()` gives up. When
// the dispatcher rejects a whole batch, its outcomes go one by one, so one bad item (a result
// over the size limit, say) does not sink the others.

import { RetryBackoff, sleep } from "./backoff.js";
import type { DispatcherClient } from "./dispatcher.js";
import { EvoraConnectionError, EvoraHTTPError } from "./errors.js";
import { RETRYABLE_STATUSES, shouldRetry } from "./http.js";
import { MAX_ERROR_MESSAGE } from "./job.js";
import type { Logger } from "./logger.js";
import type { ErrorBody, RetryAfterBody } from "./types.js";

/** The outcome of one job: `resultJson` (the result as JSON text) or `error` (with an
 * upstream's `retryAfter` when the handler threw `RetryAfter`). */
export type Ack =
  | { jobId: string; leaseToken: string; outcome: "complete"; resultJson: string }
  | { jobId: string; leaseToken: string; outcome: "fail"; error: ErrorBody; retryAfter?: RetryAfterBody };

function itemJson(ack: Ack): string {
  const head = `{"id":${JSON.stringify(ack.jobId)},"lease_token":${JSON.stringify(ack.leaseToken)}`;
  if (ack.outcome === "complete") return `${head},"outcome":"complete","result":${ack.resultJson}}`;
  const after = ack.retryAfter === undefined ? "" : `,"retry_after":${JSON.stringify(ack.retryAfter)}`;
  return `${head},"outcome":"fail","error":${JSON.stringify(ack.error)}${after}}`;
}

interface Entry {
  ack: Ack;
  onSent: (() => void) | undefined;
  resolve: (status: number) => void;
  reject: (error: unknown) => void;
}

export interface AckBatcherOptions {
  maxBatch: number;
  lingerMs: number;
  /** Whether more outcomes are likely soon (handlers still running). */
  expectMore: () => boolean;
  backoff: RetryBackoff;
  logger: Logger;
}

export class AckBatcher {
  private pending: Entry[] = [];
  private inFlight: Entry[] = [];
  private wake: (() => void) | null = null;
  private flushNow: (() => void) | null = null;
  private closing = false;
  private readonly stopped = new AbortController();
  private loop: Promise<void> | null = null;

  constructor(
    private readonly api: DispatcherClient,
    private readonly options: AckBatcherOptions,
  ) {
    if (!(options.maxBatch >= 1 && options.maxBatch <= 1000)) {
      throw new RangeError("ackBatchSize must be 1..1000 (the limit of POST /v1/acks)");
    }
  }

  start(): void {
    this.loop = this.run();
  }

  /** Queue an outcome; resolves to its status (200, 404 or 409) once the dispatcher answered.
   * `onSent` runs when the outcome goes into a batch being sent (once, even if that batch is
   * retried). */
  submit(ack: Ack, onSent?: () => void): Promise<number> {
    return new Promise((resolve, reject) => {
      this.pending.push({ ack, onSent, resolve, reject });
      this.wake?.();
      if (this.pending.length >= this.options.maxBatch || !this.options.expectMore()) this.flushNow?.();
    });
  }

  /** Send everything queued, trying for at most `withinMs`, then stop. */
  async close(withinMs: number): Promise<void> {
    this.closing = true;
    this.wake?.();
    this.flushNow?.();
    if (this.loop !== null) {
      const deadline = sleep(withinMs).then(() => "late" as const);
      if ((await Promise.race([this.loop.then(() => "done" as const), deadline])) === "late") {
        this.stopped.abort(new EvoraConnectionError("the worker stopped before this was sent", { requestSent: true }));
        await this.loop;
      }
    }
    const unsent = [...this.inFlight, ...this.pending];
    this.inFlight = [];
    this.pending = [];
    if (unsent.length > 0) {
      this.options.logger.error(
        `${unsent.length} job outcomes could not be reported; their leases will expire and the jobs will run again`,
      );
      const lost = new EvoraConnectionError("the worker stopped before this was sent", { requestSent: true });
      for (const entry of unsent) entry.reject(lost);
    }
  }

  private async run(): Promise<void> {
    while (!this.stopped.signal.aborted) {
      if (this.pending.length === 0) {
        if (this.closing) return;
        await new Promise<void>((resolve) => (this.wake = resolve));
        this.wake = null;
        continue;
      }
      if (!this.closing && this.pending.length < this.options.maxBatch && this.options.expectMore()) {
        await Promise.race([new Promise<void>((resolve) => (this.flushNow = resolve)), sleep(this.options.lingerMs)]);
        this.flushNow = null;
      }
      this.inFlight = this.pending.splice(0, this.options.maxBatch);
      for (const entry of this.inFlight) entry.onSent?.();
      try {
        await this.deliver(this.inFlight);
      } catch {
        return; // stopped by close(): it settles what is left
      }
      this.inFlight = [];
    }
  }

  private async deliver(batch: Entry[]): Promise<void> {
    for (let failures = 1; ; failures++) {
      let statuses: Map<string, number>;
      try {
        statuses = await this.send(batch.map((entry) => entry.ack));
      } catch (error) {
        if (!shouldRetry(error, true)) {
          for (const entry of batch) entry.reject(error);
          return;
        }
        const delay = this.options.backoff.delay(failures);
        this.options.logger.warn(
          `could not report ${batch.length} job outcomes (${String(error)}); retrying in ${Math.round(delay)}ms`,
        );
        await sleep(delay, this.stopped.signal);
        continue;
      }
      for (const entry of batch) {
        const status = statuses.get(entry.ack.jobId);
        if (status === undefined) entry.reject(new Error(`the dispatcher's answer lacks job ${entry.ack.jobId}`));
        else entry.resolve(status);
      }
      return;
    }
  }

  private async send(acks: Ack[]): Promise<Map<string, number>> {
    const signal = this.stopped.signal;
    try {
      const results = await this.api.acks({ raw: acks.map(itemJson) }, { retries: 0, signal });
      return new Map(results.map((result) => [result.id, result.status]));
    } catch (error) {
      if (!(error instanceof EvoraHTTPError) || RETRYABLE_STATUSES.has(error.status)) throw error;
      this.options.logger.warn(
        `the dispatcher rejected a batch of ${acks.length} outcomes (${error.message}); sending them one by one`,
      );
      const statuses = new Map<string, number>();
      for (const ack of acks) statuses.set(ack.jobId, await this.sendOne(ack, signal));
      return statuses;
    }
  }

  private async sendOne(ack: Ack, signal: AbortSignal): Promise<number> {
    const options = { retries: 0, signal };
    try {
      if (ack.outcome === "complete") {
        await this.api.complete(ack.jobId, ack.leaseToken, JSON.parse(ack.resultJson), options);
      } else {
        await this.api.fail(ack.jobId, ack.leaseToken, ack.error, undefined, options, ack.retryAfter);
      }
      return 200;
    } catch (error) {
      if (!(error instanceof EvoraHTTPError) || RETRYABLE_STATUSES.has(error.status)) throw error;
      if (error.status === 404 || error.status === 409) return error.status;
      if (ack.outcome === "complete") {
        // The result itself is refused (too large, say): running the job again would
        // produce the same, so it fails for good.
        this.options.logger.error(`job ${ack.jobId}: the dispatcher rejected its result (${error.message})`);
        const message = `the dispatcher rejected the result: ${error.message}`.slice(0, MAX_ERROR_MESSAGE);
        const failure: ErrorBody = { message, type: error.name, retryable: false };
        return this.sendOne({ jobId: ack.jobId, leaseToken: ack.leaseToken, outcome: "fail", error: failure }, signal);
      }
      this.options.logger.error(`job ${ack.jobId}: the dispatcher rejected its failure report (${error.message})`);
      return error.status;
    }
  }
}
