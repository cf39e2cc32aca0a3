// What the tests share: where the services are (environment variables set by the Python
// harness in tests/typescript), clients, a worker factory, and polling with a deadline.
// Nothing here sleeps to synchronise: `until` polls what the system shows.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { Client, RetryBackoff, Worker, type Logger, type WorkerOptions } from "../src/index.js";

function required(name: string): string {
  const value = process.env[name];
  assert.ok(value, `${name} is not set: run these tests through tests/typescript (pytest)`);
  return value;
}

export const env = {
  get apiUrl(): string {
    return required("EVORA_API_URL");
  },
  get dispatcherUrl(): string {
    return required("EVORA_DISPATCHER_URL");
  },
  get adminToken(): string {
    return required("EVORA_ADMIN_TOKEN");
  },
  get producerToken(): string {
    return required("EVORA_PRODUCER_TOKEN");
  },
  get workerToken(): string {
    return required("EVORA_WORKER_TOKEN");
  },
  get controlUrl(): string {
    return required("EVORA_TEST_CONTROL_URL");
  },
};

/** Retries wait tenths of seconds here, not the defaults. */
export const FAST = new RetryBackoff({ initialMs: 50, maxMs: 500 });

export function producer(): Client {
  return new Client({ url: env.apiUrl, token: env.producerToken, timeoutMs: 15_000, backoff: FAST });
}

export function admin(): Client {
  return new Client({ url: env.apiUrl, token: env.adminToken, timeoutMs: 15_000, backoff: FAST });
}

export function queueName(prefix: string): string {
  return `${prefix}-${randomUUID().slice(0, 8)}`;
}

/** A logger that keeps every line, for conditions on what the worker said. */
export class MemoryLogger implements Logger {
  readonly lines: string[] = [];
  debug(message: string): void {
    this.lines.push(`debug ${message}`);
  }
  info(message: string): void {
    this.lines.push(`info ${message}`);
  }
  warn(message: string): void {
    this.lines.push(`warn ${message}`);
  }
  error(message: string): void {
    this.lines.push(`error ${message}`);
  }
  saw(fragment: string): boolean {
    return this.lines.some((line) => line.includes(fragment));
  }
}

/** A worker with test-friendly timings; pass overrides in `options`. */
export function worker(queues: string[], options: Partial<WorkerOptions> = {}): Worker {
  return new Worker({
    url: env.dispatcherUrl,
    token: env.workerToken,
    queues,
    concurrency: 4,
    waitSeconds: 5,
    gracePeriodMs: 10_000,
    backoff: FAST,
    requestTimeoutMs: 5_000,
    logger: new MemoryLogger(),
    ...options,
  });
}

/** Serves `w` in the background; the returned function stops it and waits for it. */
export function serving(w: Worker): { served: Promise<void>; stop: () => Promise<void> } {
  const served = w.serve();
  return {
    served,
    stop: async () => {
      await w.stop();
      await served;
    },
  };
}

/** Polls `condition` until it holds, failing after `withinMs` with `what`. */
export async function until(
  condition: () => boolean | Promise<boolean>,
  what: string,
  withinMs = 20_000,
): Promise<void> {
  const deadline = Date.now() + withinMs;
  for (;;) {
    if (await condition()) return;
    if (Date.now() > deadline) assert.fail(`timed out after ${withinMs} ms waiting for: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

/** Waits until the job is in `state` (through the api), and returns it. */
export async function jobInState(client: Client, jobId: string, state: string, withinMs = 20_000) {
  let last = await client.get(jobId);
  await until(
    async () => {
      last = await client.get(jobId);
      return last.state === state;
    },
    `job ${jobId} ${state} (it is ${last.state})`,
    withinMs,
  );
  return last;
}

/** Restarts the dispatcher (same port), keeping it down for `downSeconds`. */
export async function restartDispatcher(downSeconds: number): Promise<void> {
  const response = await fetch(`${env.controlUrl}/dispatcher/restart?down_seconds=${downSeconds}`, {
    method: "POST",
    signal: AbortSignal.timeout(60_000),
  });
  assert.equal(response.status, 200, await response.text());
}

/** Resolves after `ms` or rejects when `signal` aborts (a handler's abortable work). */
export function work(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener(
      "abort",
      () => {
        clearTimeout(timer);
        reject(signal.reason);
      },
      { once: true },
    );
  });
}
