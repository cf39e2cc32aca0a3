// `Worker`: claims jobs from the dispatcher and runs them.
//
// Life of a job in the worker:
// 1. The claim loop long-polls `POST /v1/claim` for as many jobs as it has free slots. With
//    `prefetch`, it also claims up to that many jobs more than it can run, each claim for at
//    most `concurrency`; those wait in the worker (leased, heartbeated) for a slot, so a slot
//    that frees starts the next job at once instead of after a claim's round trip. A job
//    held so that is cancelled, or whose lease is lost, never runs (released, or
//    abandoned); on stop, held jobs are released at once.
// 2. Each job's handler is called with a `WorkerJob`. Every `heartbeatFraction` of the job's
//    lease a heartbeat extends the lease, carries reported progress and learns about cancel
//    requests.
// 3. The outcome (complete with the handler's value, or fail with its error) goes through
//    the `AckBatcher`. The job's heartbeats go on until the dispatcher has recorded it, so a
//    slow or briefly unreachable dispatcher does not let the lease expire under a finished
//    job. Its slot is freed when the outcome goes out in a batch: the next claim then runs
//    while that batch is on its way instead of after it, and as the batcher sends one batch
//    at a time, finished jobs whose outcomes are not yet recorded never number more than
//    twice `concurrency`.
// 4. A cancel request aborts `job.signal`. A handler that then throws has its job released,
//    which the dispatcher turns into CANCELLED; one that returns completes (the work was
//    done). One still running after `cancelGraceMs` is given up on and its job released.
//    An attempt past the job's `max_duration_seconds` (a heartbeat answers
//    `timeout_requested`) is stopped the same way, its signal aborted with `JobTimeoutError`,
//    but the attempt is failed (error type `timeout`), not released: a release would not
//    count it (docs/jobs-that-wait.md).
// 5. A heartbeat answered 409 lease_lost (or 404) means another attempt owns the job: its
//    signal aborts with the `LeaseLostError`, the worker emits "leaseLost" and reports
//    nothing for it. An outcome the dispatcher refuses with 409 is reported the same way.
// 6. JavaScript cannot stop a function from outside. A handler given up on (the cancel
//    grace or the shutdown grace period over, or the lease lost) keeps its slot until it
//    settles, so the worker never runs more handlers than `concurrency` at once, and
//    whatever it eventually returns is discarded.
//
// Shutdown (`stop()`, or SIGTERM/SIGINT under `run()`): the long-poll is aborted, in-flight
// jobs get `gracePeriodMs` to finish, those still running after it have their signal
// aborted (`WorkerShutdownError`) and their jobs released at once (a second signal does
// that without waiting), outcomes are flushed, and `serve()` resolves.
//
// When the dispatcher cannot be reached (it restarts, say), claims are retried with capped
// exponential backoff and jitter ("claimFailed"), and "reconnected" is emitted once a claim
// succeeds again. Outcomes wait in the batcher meanwhile and are retried the same way.

import { EventEmitter } from "node:events";
import { hostname } from "node:os";
import { randomBytes } from "node:crypto";
import { AckBatcher, type Ack } from "./acks.js";
import { RetryBackoff, sleep } from "./backoff.js";
import { DispatcherClient } from "./dispatcher.js";
import {
  EvoraConnectionError,
  EvoraError,
  EvoraHTTPError,
  JobCancelledError,
  JobNotFoundError,
  LeaseLostError,
  RetryAfter,
  Snooze,
  WorkerShutdownError,
} from "./errors.js";
import { shouldRetry } from "./http.js";
import { TIMEOUT_ERROR, WorkerJob, failureFrom } from "./job.js";
import { consoleLogger, type Logger } from "./logger.js";
import type { ClaimedJob, ErrorBody, Submission } from "./types.js";

/** A handler: takes the job, returns (or resolves to) its JSON-serialisable result. */
export type Handler<Payload = unknown> = (job: WorkerJob<Payload>) => unknown;

const MAX_CLAIM_JOBS = 500;
const MAX_CLAIM_QUEUES = 20;
const MAX_WAIT_SECONDS = 60;
const QUEUE_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/;
const TYPE_PATTERN = /^[A-Za-z0-9_.:-]{1,255}$/;
// With waitSeconds 0 (no long-poll), how long an idle worker waits before asking again.
const IDLE_PAUSE_MS = 500;
// While backing off after failed claims, how often the worker asks whether the dispatcher is
// ready again: it resumes within about this long of the dispatcher (and its database) being
// back, however long the backoff has grown.
const READY_PROBE_MS = 1_000;
// After the grace period, how long the last outcomes may take to be sent.
const FINAL_FLUSH_MS = 1_000;

export interface WorkerOptions {
  /** The dispatcher, e.g. http://127.0.0.1:8081. */
  url: string;
  /** A `worker` token. */
  token?: string;
  /** 1..20 queue names to claim from. */
  queues: string[];
  /** Handlers running at once (default 10). */
  concurrency?: number;
  /** Jobs held claimed beyond `concurrency`, each waiting for a free slot (default 0). */
  prefetch?: number;
  /** Handlers by job type; `worker.handle(type, fn)` adds more. */
  handlers?: Record<string, Handler>;
  /** Job types to claim; defaults to the types with a handler. */
  types?: string[];
  workerId?: string;
  /** How long one claim long-polls, 0..60 s (default 20). */
  waitSeconds?: number;
  /** On stop, how long in-flight jobs may still run before being released (default 30 s). */
  gracePeriodMs?: number;
  /** Heartbeat every this fraction of a job's lease (default 1/3). */
  heartbeatFraction?: number;
  /** After a cancel request, how long a handler may take to stop (default 5 s). */
  cancelGraceMs?: number;
  /** How long outcomes wait for company while handlers run (default 5 ms). */
  ackLingerMs?: number;
  /** Outcomes per `POST /v1/acks`, 1..1000 (default 500, as many as one claim hands out). */
  ackBatchSize?: number;
  /** Bound of every call but the long-poll, which gets `waitSeconds` more (default 10 s). */
  requestTimeoutMs?: number;
  /** After the grace period, bound of releasing the jobs still running (default 10 s). */
  shutdownTimeoutMs?: number;
  /** Between failed claims or outcome reports (default 0.5 s growing to 30 s). */
  backoff?: RetryBackoff;
  logger?: Logger;
}

/** The events a worker emits (`worker.on(name, listener)`). */
export interface WorkerEvents {
  /** A claim failed; the next one goes after `delayMs`. */
  claimFailed: [error: EvoraError, delayMs: number, failures: number];
  /** A claim succeeded after `failures` failed ones. */
  reconnected: [failures: number];
  /** The job's lease belongs to another attempt now; nothing is reported for it. */
  leaseLost: [job: WorkerJob, during: "heartbeat" | "outcome", error: EvoraError | null];
  /** The job was handed back (cancel requested, or the worker stopping). */
  released: [job: WorkerJob, why: "cancel" | "shutdown"];
  /** The handler threw `Snooze`: the job runs again in `seconds`, no attempt used up. */
  snoozed: [job: WorkerJob, seconds: number];
  /** The handler suspended the job on a callback (`WorkerJob.suspend`). */
  suspended: [job: WorkerJob, callbackId: string];
  /** The dispatcher recorded the job's outcome. */
  reported: [job: WorkerJob, outcome: "complete" | "fail"];
}

type Interrupt = "cancel" | "timeout" | "shutdown" | "leaseLost";

/** One job inside the worker. */
class Running {
  heartbeat: NodeJS.Timeout | undefined;
  cancelTimer: NodeJS.Timeout | undefined;
  /** Why the worker gave up on the handler, if it did. */
  interrupted: Interrupt | null = null;
  handlerDone = false;
  /** Whether the job still counts against the worker's concurrency. */
  holdsSlot = true;
  /** Claimed ahead (`prefetch`) and waiting for a slot to run in. */
  waiting = false;
  /** Settles once the handler has (the worker may stop waiting for it sooner). */
  handlerSettled: Promise<void> = Promise.resolve();
  /** Settles once the job is over for the worker: its outcome reported or given up. */
  finished: Promise<void> = Promise.resolve();
  private onInterrupt: ((why: Interrupt) => void) | null = null;
  readonly interruption: Promise<Interrupt>;

  constructor(readonly job: WorkerJob) {
    this.interruption = new Promise((resolve) => (this.onInterrupt = resolve));
  }

  interrupt(why: Interrupt, reason: Error): void {
    this.job.abort(reason);
    if (this.handlerDone || this.interrupted !== null) return;
    this.interrupted = why;
    this.onInterrupt?.(why);
  }

  stopTimers(): void {
    clearTimeout(this.heartbeat);
    clearTimeout(this.cancelTimer);
  }
}

type Outcome =
  | { kind: "ack"; ack: Ack }
  | { kind: "release"; why: "cancel" | "shutdown" }
  | { kind: "snooze"; seconds: number }
  | { kind: "suspended" }
  | { kind: "abandon" };

/** `size` handlers at once: jobs claimed ahead wait here for a slot, first come first
 * served. */
class RunSlots {
  private free: number;
  private readonly line: Array<() => void> = [];

  constructor(size: number) {
    this.free = size;
  }

  /** `ready` resolves once a slot is the caller's; `leave()` gives it back, or leaves the
   * line if it has not come yet. */
  take(): { ready: Promise<void>; leave: () => void } {
    if (this.free > 0) {
      this.free -= 1;
      return { ready: Promise.resolve(), leave: () => this.give() };
    }
    let granted = false;
    let grant!: () => void;
    const ready = new Promise<void>((resolve) => (grant = resolve));
    const entry = (): void => {
      granted = true;
      grant();
    };
    this.line.push(entry);
    return {
      ready,
      leave: () => {
        if (granted) {
          this.give();
          return;
        }
        const at = this.line.indexOf(entry);
        if (at >= 0) this.line.splice(at, 1);
      },
    };
  }

  private give(): void {
    const next = this.line.shift();
    if (next === undefined) this.free += 1;
    else next();
  }
}

function defaultWorkerId(): string {
  return `${hostname()}-${process.pid}-${randomBytes(3).toString("hex")}`;
}

export class Worker extends EventEmitter<WorkerEvents> {
  readonly workerId: string;
  readonly queues: readonly string[];
  readonly concurrency: number;
  readonly prefetch: number;
  private readonly handlers = new Map<string, Handler>();
  // With prefetch, `concurrency` of the jobs held run; the others wait for a slot here.
  private readonly runSlots: RunSlots | null;
  private readonly options: WorkerOptions;
  private readonly api: DispatcherClient;
  private readonly acks: AckBatcher;
  private readonly logger: Logger;
  private readonly backoff: RetryBackoff;
  private readonly running = new Set<Running>();
  // Slots stay taken until a job's outcome is sent and its handler has settled: otherwise
  // claims outrun acks under a backlog and unsent outcomes pile up.
  private busy = 0;
  private handlersRunning = 0;
  private slotFreed: (() => void) | null = null;
  private readonly stopping = new AbortController();
  private started = false;
  private served: Promise<void> | null = null;

  constructor(options: WorkerOptions) {
    super();
    this.options = options;
    this.workerId = options.workerId ?? defaultWorkerId();
    this.queues = [...options.queues];
    this.concurrency = options.concurrency ?? 10;
    this.prefetch = options.prefetch ?? 0;
    this.runSlots = this.prefetch > 0 ? new RunSlots(this.concurrency) : null;
    this.logger = options.logger ?? consoleLogger();
    this.backoff = options.backoff ?? new RetryBackoff({ initialMs: 500, maxMs: 10_000 });
    this.validate();
    for (const [type, handler] of Object.entries(options.handlers ?? {})) this.handle(type, handler);
    this.api = new DispatcherClient({
      url: options.url,
      ...(options.token === undefined ? {} : { token: options.token }),
      timeoutMs: options.requestTimeoutMs ?? 10_000,
    });
    this.acks = new AckBatcher(this.api, {
      maxBatch: options.ackBatchSize ?? 500,
      lingerMs: options.ackLingerMs ?? 5,
      expectMore: () => this.handlersRunning > 0,
      backoff: this.backoff,
      logger: this.logger,
    });
  }

  private validate(): void {
    const { queues, concurrency } = this;
    if (queues.length < 1 || queues.length > MAX_CLAIM_QUEUES) {
      throw new RangeError(`a worker needs 1..${MAX_CLAIM_QUEUES} queues, got ${queues.length}`);
    }
    const invalid = queues.find((queue) => !QUEUE_PATTERN.test(queue));
    if (invalid !== undefined) throw new RangeError(`invalid queue name ${JSON.stringify(invalid)}`);
    if (!Number.isInteger(concurrency) || concurrency < 1) throw new RangeError("concurrency must be at least 1");
    if (!Number.isInteger(this.prefetch) || this.prefetch < 0) throw new RangeError("prefetch must not be negative");
    const wait = this.waitSeconds;
    if (!(wait >= 0 && wait <= MAX_WAIT_SECONDS)) throw new RangeError(`waitSeconds must be 0..${MAX_WAIT_SECONDS}`);
    const fraction = this.options.heartbeatFraction ?? 1 / 3;
    if (!(fraction > 0 && fraction < 1)) throw new RangeError("heartbeatFraction must be between 0 and 1");
  }

  private get waitSeconds(): number {
    return this.options.waitSeconds ?? 20;
  }

  /** Register the handler for jobs of `type`. */
  handle<Payload = unknown>(type: string, handler: Handler<Payload>): this {
    if (!TYPE_PATTERN.test(type)) throw new RangeError(`invalid job type ${JSON.stringify(type)}`);
    if (this.handlers.has(type)) throw new Error(`a handler for ${JSON.stringify(type)} is already registered`);
    this.handlers.set(type, handler as Handler);
    return this;
  }

  /** Serve until SIGTERM or SIGINT, then shut down gracefully; a second signal releases the
   * jobs still running at once. Resolves when the worker has stopped. */
  async run(): Promise<void> {
    const onSignal = (signal: NodeJS.Signals): void => {
      if (this.stopping.signal.aborted) {
        this.logger.warn(`${signal} again: releasing the jobs still running`);
        this.interruptAll();
      } else {
        this.logger.info(`${signal}: stopping (grace period ${this.gracePeriodMs} ms)`);
        this.requestStop();
      }
    };
    process.on("SIGTERM", onSignal);
    process.on("SIGINT", onSignal);
    try {
      await this.serve();
    } finally {
      process.off("SIGTERM", onSignal);
      process.off("SIGINT", onSignal);
    }
  }

  /** Stop claiming, give in-flight jobs the grace period, release the rest; resolves when
   * `serve()` has finished (at once if it never started, and then it will not). */
  async stop(): Promise<void> {
    this.requestStop();
    if (this.served !== null) await this.served.catch(() => undefined);
  }

  /** Claim and run jobs until `stop()`. Rejects with the `EvoraHTTPError` with which the
   * dispatcher refuses to hand out jobs at all (a wrong token or role, invalid queue
   * names), after shutting down as on `stop()`. A Worker serves once. */
  async serve(): Promise<void> {
    if (this.started) throw new Error("this Worker has already served; create a new one");
    const types = this.options.types ?? [...this.handlers.keys()].sort();
    if (types.length === 0) throw new Error("no handlers registered and no types given: nothing to claim");
    this.started = true;
    this.served = this.serveTypes(types);
    await this.served;
  }

  private get gracePeriodMs(): number {
    return this.options.gracePeriodMs ?? 30_000;
  }

  private requestStop(): void {
    if (!this.stopping.signal.aborted) this.stopping.abort(new Error("the worker is stopping"));
    this.slotFreed?.();
  }

  private interruptAll(): void {
    for (const running of this.running) running.interrupt("shutdown", new WorkerShutdownError(running.job.id));
  }

  private async serveTypes(types: string[]): Promise<void> {
    this.acks.start();
    this.logger.info(
      `worker ${this.workerId} claiming ${types.join(", ")} from queues ${this.queues.join(", ")} at ${this.options.url}, concurrency ${this.concurrency}`,
    );
    try {
      await this.claimLoop(types);
    } finally {
      await this.shutdown();
    }
  }

  private async claimLoop(types: string[]): Promise<void> {
    const stop = this.stopping.signal;
    let failures = 0;
    while (!stop.aborted) {
      if (this.busy >= this.concurrency + this.prefetch) {
        await new Promise<void>((resolve) => (this.slotFreed = resolve));
        this.slotFreed = null;
        continue;
      }
      let jobs: ClaimedJob[];
      try {
        jobs = await this.api.claim(
          {
            worker_id: this.workerId,
            queues: [...this.queues],
            max_jobs: Math.min(this.concurrency + this.prefetch - this.busy, this.concurrency, MAX_CLAIM_JOBS),
            wait_seconds: this.waitSeconds,
            types,
          },
          { signal: stop },
        );
      } catch (error) {
        if (stop.aborted) return;
        if (!(error instanceof EvoraError)) throw error;
        if (error instanceof EvoraHTTPError && error.status < 500 && error.status !== 429) {
          this.logger.error(`the dispatcher refuses to hand out jobs: ${error.message}`);
          throw error;
        }
        failures += 1;
        const delay = this.backoff.delay(failures);
        this.logger.warn(`claim failed (${error.message}); retrying in ${Math.round(delay)} ms at most`);
        this.emit("claimFailed", error, delay, failures);
        await this.backOff(delay, meansUnready(error), stop);
        continue;
      }
      if (failures > 0) {
        this.logger.info(`claiming again after ${failures} failed attempts`);
        this.emit("reconnected", failures);
        failures = 0;
      }
      for (const data of jobs) this.start(data);
      if (jobs.length > 0) {
        // Let the handlers just started begin before the next claim is built and sent: they
        // are what the jobs' submitters wait for; the next claim (mostly held by the
        // dispatcher as a long-poll) can wait one turn.
        await new Promise(setImmediate);
      } else if (this.waitSeconds === 0) {
        await sleep(IDLE_PAUSE_MS, stop).catch(() => undefined);
      }
    }
  }

  /**
   * Waits `delayMs` after a failed claim, or less: once the dispatcher has been seen
   * unavailable (the failed claim itself, if it could not connect or was answered 503, or a
   * probe), it is asked every ~READY_PROBE_MS whether it is ready again (`GET /readyz`), and
   * the worker claims as soon as it is. The backoff still spaces claims out while the
   * dispatcher is ready but refuses them (a 500, a 429): only the way back from an outage is
   * shortened, to within a probe of the dispatcher being ready.
   */
  private async backOff(delayMs: number, unready: boolean, stop: AbortSignal): Promise<void> {
    const deadline = Date.now() + delayMs;
    let seenUnready = unready;
    for (let left = delayMs; left > 0 && !stop.aborted; left = deadline - Date.now()) {
      const pause = Math.min(left, READY_PROBE_MS * (0.75 + Math.random() / 2));
      await sleep(pause, stop).catch(() => undefined);
      if (stop.aborted || Date.now() >= deadline) return;
      const ready = await this.api.ready({ timeoutMs: READY_PROBE_MS, signal: stop });
      if (ready && seenUnready) {
        this.logger.info("the dispatcher is ready again; claiming");
        return;
      }
      seenUnready = seenUnready || !ready;
    }
  }

  private start(data: ClaimedJob): void {
    const job = new WorkerJob(data);
    job.attach((name, value) => this.api.checkpoint(job.id, job.leaseToken, name, value));
    const running = new Running(job);
    running.job.suspender = (timeoutSeconds, onTimeout) => this.suspend(running, timeoutSeconds, onTimeout);
    running.job.spawner = (jobs, onDependencyFailure) => this.spawnChildren(running, jobs, onDependencyFailure);
    this.busy += 1;
    this.running.add(running);
    running.finished = this.process(running);
  }

  private async process(running: Running): Promise<void> {
    const { job } = running;
    this.scheduleHeartbeat(running, job.leaseSeconds * 1000 * (this.options.heartbeatFraction ?? 1 / 3));
    try {
      const outcome = await this.execute(running);
      if (outcome.kind === "release") await this.release(running, outcome.why);
      else if (outcome.kind === "snooze") await this.snooze(running, outcome.seconds);
      else if (outcome.kind === "ack") await this.report(running, outcome.ack);
    } catch (error) {
      this.logger.error(
        `job ${job.id}: could not tell the dispatcher how it ended (${String(error)}); it will run again when its lease expires`,
      );
    } finally {
      running.stopTimers();
      this.running.delete(running);
      if (!running.handlerDone) {
        this.logger.warn(
          `job ${job.id}: its handler is still running; it keeps its slot until it settles, and whatever it returns is discarded`,
        );
      }
      void running.handlerSettled.then(() => this.releaseSlot(running));
    }
  }

  /** Frees the job's slot, once; never while its handler still runs. */
  private releaseSlot(running: Running): void {
    if (!running.holdsSlot || !running.handlerDone) return;
    running.holdsSlot = false;
    this.busy -= 1;
    this.slotFreed?.();
  }

  private async execute(running: Running): Promise<Outcome> {
    const { job } = running;
    const handler = this.handlers.get(job.type);
    if (handler === undefined) {
      // Retryable: another worker of the fleet may know the type.
      this.logger.error(`job ${job.id}: no handler for type ${JSON.stringify(job.type)}`);
      const message = `worker ${this.workerId} has no handler for ${JSON.stringify(job.type)}`;
      running.handlerDone = true;
      return this.fail(job, { message, type: "UnknownJobType", retryable: true });
    }
    let slot: { leave: () => void } | null = null;
    if (this.runSlots !== null) {
      const taken = this.runSlots.take();
      running.waiting = true;
      const first = await Promise.race([taken.ready.then(() => null), running.interruption]);
      running.waiting = false;
      if (first !== null) {
        // Interrupted while it waited: it never runs.
        taken.leave();
        running.handlerDone = true;
        return this.interrupted(job, first);
      }
      slot = taken;
    }
    this.handlersRunning += 1;
    const ended = Promise.resolve()
      .then(() => handler(job))
      .then(
        (value) => ({ threw: false as const, value }),
        (error: unknown) => ({ threw: true as const, error }),
      )
      .finally(() => {
        running.handlerDone = true;
        this.handlersRunning -= 1;
        // A handler given up on keeps its slot until it settles, as it keeps its job's.
        slot?.leave();
      });
    running.handlerSettled = ended.then(() => undefined);
    const settled = await Promise.race([ended, running.interruption]);
    if (job.leftWorker) {
      // suspended, or waiting for children: the attempt left the worker then, and there is
      // nothing to report
      if (typeof settled !== "string" && (settled.threw || settled.value !== undefined)) {
        this.logger.warn(`job ${job.id}: suspended or waiting for children, so what its handler ended with is dropped`);
      }
      return { kind: "suspended" };
    }
    if (typeof settled === "string") return this.interrupted(job, settled);
    if (settled.threw) {
      // Failed, not handed back: a release would not count the attempt, and the job would
      // run past its limit attempt after attempt.
      if (job.timeoutRequested) return this.fail(job, { ...TIMEOUT_ERROR });
      if (job.cancelRequested) return { kind: "release", why: "cancel" };
      if (settled.error instanceof Snooze) return { kind: "snooze", seconds: settled.error.seconds };
      const failure = failureFrom(settled.error);
      this.logger.warn(
        `job ${job.id} (${job.type}, attempt ${job.attempt} of ${job.maxAttempts}) failed: ${failure.message}`,
      );
      if (settled.error instanceof RetryAfter) {
        const retryAfter = { limit_key: settled.error.limitKey, seconds: settled.error.seconds };
        return { kind: "ack", ack: { jobId: job.id, leaseToken: job.leaseToken, outcome: "fail", error: failure, retryAfter } };
      }
      return this.fail(job, failure);
    }
    let resultJson: string | undefined;
    try {
      resultJson = JSON.stringify(settled.value) ?? "null";
    } catch (error) {
      // Deterministic: running the handler again would return the same thing.
      const message = `the handler's result is not JSON-serialisable: ${String(error)}`;
      this.logger.error(`job ${job.id}: ${message}`);
      return this.fail(job, { message, type: "TypeError", retryable: false });
    }
    return { kind: "ack", ack: { jobId: job.id, leaseToken: job.leaseToken, outcome: "complete", resultJson } };
  }

  /** What to report for a handler the worker gave up on (or a job it never started). */
  private interrupted(job: WorkerJob, why: Interrupt): Outcome {
    if (why === "leaseLost") return { kind: "abandon" };
    if (why === "timeout") return this.fail(job, { ...TIMEOUT_ERROR });
    return { kind: "release", why };
  }

  private fail(job: WorkerJob, error: ErrorBody): Outcome {
    return { kind: "ack", ack: { jobId: job.id, leaseToken: job.leaseToken, outcome: "fail", error } };
  }

  private async report(running: Running, ack: Ack): Promise<void> {
    const status = await this.acks.submit(ack, () => this.releaseSlot(running));
    if (status === 200) {
      this.emit("reported", running.job, ack.outcome);
    } else if (status === 409) {
      this.logger.warn(
        `job ${ack.jobId}: its lease was lost before the outcome was recorded (another attempt owns it now)`,
      );
      this.emit("leaseLost", running.job, "outcome", null);
    } else if (status === 404) {
      this.logger.warn(`job ${ack.jobId} no longer exists; its outcome was dropped`);
    } else {
      this.logger.error(`job ${ack.jobId}: the dispatcher answered ${status} to its outcome`);
    }
  }

  private async release(running: Running, why: "cancel" | "shutdown"): Promise<void> {
    const { job } = running;
    try {
      await this.api.release(job.id, job.leaseToken);
    } catch (error) {
      if (error instanceof LeaseLostError || error instanceof JobNotFoundError) {
        this.logger.info(`job ${job.id}: nothing to release (${error.message})`);
        return;
      }
      throw error;
    }
    this.logger.info(`job ${job.id} released (${why})`);
    this.emit("released", job, why);
  }

  /** `WorkerJob.suspend`: the heartbeats stop first (once suspended, the job's lease is gone
   * and a heartbeat would abort the handler as if it had been lost). */
  private async suspend(running: Running, timeoutSeconds: number, onTimeout: "fail" | "dlq" | "resume"): Promise<string> {
    const { job } = running;
    running.stopTimers();
    const answer = await this.api.suspend(job.id, job.leaseToken, timeoutSeconds, onTimeout);
    if (answer.callback_id === null || answer.callback_id === undefined) throw new JobCancelledError(job.id);
    this.logger.info(`job ${job.id} suspended on a callback for at most ${timeoutSeconds} s`);
    this.emit("suspended", job, answer.callback_id);
    return answer.callback_id;
  }

  private async spawnChildren(
    running: Running,
    jobs: Submission[],
    onDependencyFailure: "cancel" | "run" | undefined,
  ): Promise<string[]> {
    const { job } = running;
    running.stopTimers();
    const answer = await this.api.spawnChildren(job.id, job.leaseToken, jobs, onDependencyFailure);
    if (answer.children.length === 0) throw new JobCancelledError(job.id);
    this.logger.info(`job ${job.id} waits for ${answer.children.length} children`);
    return answer.children.map((child) => child.id);
  }

  private async snooze(running: Running, seconds: number): Promise<void> {
    const { job } = running;
    try {
      await this.api.snooze(job.id, job.leaseToken, seconds);
    } catch (error) {
      if (error instanceof LeaseLostError || error instanceof JobNotFoundError) {
        this.logger.info(`job ${job.id}: nothing to snooze (${error.message})`);
        return;
      }
      throw error;
    }
    this.logger.info(`job ${job.id} snoozed for ${seconds} s`);
    this.emit("snoozed", job, seconds);
  }

  private scheduleHeartbeat(running: Running, intervalMs: number, delayMs = intervalMs): void {
    running.heartbeat = setTimeout(() => void this.beat(running, intervalMs), delayMs);
  }

  private async beat(running: Running, intervalMs: number): Promise<void> {
    const { job } = running;
    const sentAt = Date.now();
    let delay = intervalMs;
    const progress = job.takeProgress();
    try {
      const answer = await this.api.heartbeat(
        job.id,
        job.leaseToken,
        progress === undefined ? {} : { progressJson: progress },
        { retries: 0, timeoutMs: Math.min(intervalMs, this.options.requestTimeoutMs ?? 10_000) },
      );
      if (answer.timeout_requested && !job.timeoutRequested) {
        job.requestTimeout();
        this.stopRequested(running, "timeout");
      } else if (answer.cancel_requested && !job.cancelRequested) {
        job.requestCancel();
        this.stopRequested(running, "cancel");
      }
    } catch (error) {
      if (error instanceof LeaseLostError || error instanceof JobNotFoundError) {
        this.logger.warn(`job ${job.id}: ${error.message}; abandoning it`);
        running.interrupt("leaseLost", error);
        this.emit("leaseLost", job, "heartbeat", error);
        return;
      }
      if (shouldRetry(error, true)) {
        if (progress !== undefined) job.restoreProgress(progress);
        // Sooner than usual: the lease keeps running out meanwhile.
        delay = intervalMs / 4;
      }
      this.logger.warn(`job ${job.id}: heartbeat failed: ${String(error)}`);
    }
    if (this.running.has(running)) this.scheduleHeartbeat(running, intervalMs, Math.max(0, sentAt + delay - Date.now()));
  }

  /** The job's signal has aborted, for a cancel request or the attempt past its time limit:
   * interrupt the handler if it has not ended after `cancelGraceMs`. */
  private stopRequested(running: Running, why: "cancel" | "timeout"): void {
    if (running.waiting) {
      running.interrupt(why, running.job.signal.reason as Error); // it never starts
      return;
    }
    if (running.handlerDone) return;
    const graceMs = this.options.cancelGraceMs ?? 5_000;
    const what = why === "cancel" ? "cancellation requested" : "past max_duration_seconds";
    this.logger.info(`job ${running.job.id}: ${what}; the handler has ${graceMs} ms to stop`);
    clearTimeout(running.cancelTimer); // a timeout after a cancel restarts it
    running.cancelTimer = setTimeout(() => running.interrupt(why, running.job.signal.reason as Error), graceMs);
  }

  private async waitRunning(ms: number): Promise<void> {
    if (this.running.size === 0) return;
    const all = Promise.all([...this.running].map((running) => running.finished));
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([all, new Promise((resolve) => (timer = setTimeout(resolve, ms)))]);
    clearTimeout(timer);
  }

  private async shutdown(): Promise<void> {
    this.requestStop();
    // Jobs claimed ahead that have not started go back at once, not after the grace.
    for (const running of this.running) {
      if (running.waiting) running.interrupt("shutdown", new WorkerShutdownError(running.job.id));
    }
    if (this.running.size > 0) {
      this.logger.info(`waiting up to ${this.gracePeriodMs} ms for ${this.running.size} jobs to finish`);
      await this.waitRunning(this.gracePeriodMs);
      this.interruptAll();
      await this.waitRunning(this.options.shutdownTimeoutMs ?? 10_000);
    }
    if (this.running.size > 0) {
      this.logger.error(`giving up on ${this.running.size} jobs; their leases will expire`);
      for (const running of this.running) running.stopTimers();
    }
    await this.acks.close(FINAL_FLUSH_MS);
    this.logger.info(`worker ${this.workerId} stopped`);
  }
}

/** Whether a failed claim says the dispatcher is unavailable (down, restarting, or without
 * its database), rather than up and refusing this request. */
function meansUnready(error: EvoraError): boolean {
  if (error instanceof EvoraHTTPError) return error.status === 503;
  return error instanceof EvoraConnectionError;
}
