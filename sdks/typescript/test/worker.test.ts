// `Worker` against the real dispatcher: results and failures, progress, concurrency, and
// outcomes recorded in batches through POST /v1/acks.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { isDeepStrictEqual } from "node:util";
import { CallbackNotFoundError, Client, NonRetryableError, RetryAfter, Snooze, UnauthorizedError } from "../src/index.js";
import { admin, env, jobInState, producer, queueName, serving, until, worker } from "./support.js";

/** The dispatcher's count of answered requests to `route` (from /metrics). */
async function requests(route: string): Promise<number> {
  const text = await (await fetch(`${env.dispatcherUrl}/metrics`)).text();
  let total = 0;
  for (const line of text.split("\n")) {
    if (line.startsWith("evora_http_requests_total{") && line.includes(`route="${route}"`)) {
      total += Number(line.slice(line.lastIndexOf(" ") + 1));
    }
  }
  return total;
}

describe("Worker", () => {
  const client = producer();

  test("completes with the handler's value and fails with its error", async () => {
    const queue = queueName("ts-outcomes");
    const w = worker([queue]);
    w.handle<{ n: number }>("ts.double", (job) => ({ doubled: job.payload.n * 2 }));
    w.handle("ts.flaky", (job) => {
      throw new Error(`flaky attempt ${job.attempt}`);
    });
    w.handle("ts.fatal", () => {
      throw new NonRetryableError("never again");
    });
    w.handle("ts.bigint", () => ({ n: 10n }));
    w.handle("ts.nothing", async () => undefined);
    const run = serving(w);
    try {
      const [double, flaky, fatal, bigint, nothing] = await client.submitBatch([
        { queue, type: "ts.double", payload: { n: 21 } },
        { queue, type: "ts.flaky", max_attempts: 2, backoff: { initial_seconds: 0.05, max_seconds: 0.05, multiplier: 1 } },
        { queue, type: "ts.fatal", max_attempts: 5 },
        { queue, type: "ts.bigint" },
        { queue, type: "ts.nothing" },
      ]);
      assert.deepEqual((await jobInState(client, double!.id, "COMPLETED")).result, { doubled: 42 });
      assert.equal((await jobInState(client, nothing!.id, "COMPLETED")).result, null);
      const flakyJob = await jobInState(client, flaky!.id, "DLQ");
      assert.equal(flakyJob.attempt, 2);
      assert.deepEqual(flakyJob.last_error, { message: "flaky attempt 2", type: "Error" });
      const fatalJob = await jobInState(client, fatal!.id, "DLQ");
      assert.equal(fatalJob.attempt, 1);
      assert.equal(fatalJob.last_error?.type, "NonRetryableError");
      const bigintJob = await jobInState(client, bigint!.id, "DLQ");
      assert.equal(bigintJob.attempt, 1);
      assert.match(bigintJob.last_error?.message ?? "", /not JSON-serialisable/);
    } finally {
      await run.stop();
    }
  });

  test("a thrown Snooze runs the job again later without using up an attempt", async () => {
    const queue = queueName("ts-snooze");
    const w = worker([queue]);
    const runs: [number, number][] = [];
    const snoozed: number[] = [];
    w.on("snoozed", (_job, seconds) => snoozed.push(seconds));
    w.handle("ts.poll", (job) => {
      runs.push([job.attempt, job.snoozes]);
      if (runs.length <= 3) throw new Snooze(0.1);
      return "ready";
    });
    const run = serving(w);
    try {
      const { id } = await client.submit(queue, "ts.poll", {}, { max_attempts: 1 });
      const job = await jobInState(client, id, "COMPLETED");
      assert.deepEqual([job.attempt, job.snoozes, job.result], [1, 3, "ready"]);
      assert.deepEqual(runs, [[1, 0], [1, 1], [1, 2], [1, 3]]);
      assert.deepEqual(snoozed, [0.1, 0.1, 0.1]);
    } finally {
      await run.stop();
    }
  });

  test("a thrown RetryAfter drains the key and runs the job again without using up an attempt", async () => {
    const queue = queueName("ts-retry-after");
    const key = `${queue}:upstream`;
    await admin().setLimit(key, { concurrency: 10, rate: null });
    const w = worker([queue]);
    const runs: number[] = [];
    w.handle("ts.call", (job) => {
      runs.push(job.attempt);
      if (runs.length <= 2) throw new RetryAfter(0.2, { limitKey: key });
      return "answered";
    });
    const run = serving(w);
    try {
      const { id } = await client.submit(queue, "ts.call", {}, { max_attempts: 1, limit_keys: [key] });
      const job = await jobInState(client, id, "COMPLETED");
      assert.deepEqual([job.attempt, job.result], [1, "answered"]);
      assert.deepEqual(runs, [1, 1, 1]);
      assert.equal(job.last_error?.type, "RetryAfter");
    } finally {
      await run.stop();
    }
  });

  test("a handler suspends on a callback and its next run sees the resolution's payload", async () => {
    const queue = queueName("ts-suspend");
    const w = worker([queue]);
    const callbacks: string[] = [];
    const seen: unknown[] = [];
    w.handle("ts.approve", async (job) => {
      seen.push(job.callback?.payload ?? null);
      if (job.callback === null) {
        callbacks.push(await job.suspend(3600, "fail"));
        return undefined;
      }
      return { approved: (job.callback.payload as { ok: boolean }).ok };
    });
    const run = serving(w);
    try {
      const { id } = await client.submit(queue, "ts.approve", {}, { max_attempts: 1 });
      await jobInState(client, id, "SUSPENDED");
      assert.equal(callbacks.length, 1);
      // a webhook sender needs no token: the callback id is the credential
      const sender = new Client({ url: env.apiUrl });
      const resolution = await sender.resolveCallback(callbacks[0]!, { ok: true });
      assert.deepEqual(resolution.payload, { ok: true });
      assert.deepEqual(await sender.resolveCallback(callbacks[0]!, { ok: false }), resolution);
      await assert.rejects(sender.resolveCallback(`evcb_${"0".repeat(64)}`), CallbackNotFoundError);
      const job = await jobInState(client, id, "COMPLETED");
      assert.deepEqual([job.attempt, job.result], [1, { approved: true }]);
      assert.deepEqual(seen, [null, { ok: true }]);
      const events = (await client.events(id)).map((e) => e.event);
      assert.deepEqual(events, ["submitted", "claimed", "suspended", "resumed", "claimed", "completed"]);
    } finally {
      await run.stop();
    }
  });

  test("a handler spawns children and its next run sees their results", async () => {
    const queue = queueName("ts-children");
    const w = worker([queue]);
    const spawned: string[][] = [];
    w.handle("ts.sum", async (job) => {
      const results = Object.values(job.dependencyResults) as number[];
      if (results.length === 0) {
        spawned.push(await job.spawnChildren([1, 2, 3].map((n) => ({ queue, type: "ts.square", payload: { n } }))));
        return "dropped: the job waits for its children";
      }
      return results.reduce((a, b) => a + b, 0);
    });
    w.handle("ts.square", async (job) => {
      const { n } = job.payload as { n: number };
      return n * n;
    });
    const run = serving(w);
    try {
      const { id } = await client.submit(queue, "ts.sum", {}, { max_attempts: 1 });
      const job = await jobInState(client, id, "COMPLETED");
      // the first run's return was dropped, and waiting used up no attempt of the one it has
      assert.deepEqual([job.attempt, job.result], [1, 1 + 4 + 9]);
      assert.equal(spawned.length, 1);
      assert.deepEqual(job.depends_on, spawned[0]);
      const events = (await client.events(id)).map((e) => e.event);
      assert.deepEqual(events, ["submitted", "claimed", "awaiting_children", "dependencies_met", "claimed", "completed"]);
    } finally {
      await run.stop();
    }
  });

  test("progress goes with the heartbeats", async () => {
    const queue = queueName("ts-progress");
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const w = worker([queue]);
    w.handle("ts.progress", async (job) => {
      job.progress({ step: 1, of: 2 });
      await gate;
      return "done";
    });
    const run = serving(w);
    try {
      const { id } = await client.submit(queue, "ts.progress", null, { lease_seconds: 1 });
      await until(async () => {
        const job = await client.get(id);
        return isDeepStrictEqual(job.progress, { step: 1, of: 2 });
      }, "the progress reported by a heartbeat");
      release();
      await jobInState(client, id, "COMPLETED");
    } finally {
      await run.stop();
    }
  });

  test("never runs more than `concurrency` handlers, and records outcomes in batches", async () => {
    const queue = queueName("ts-batches");
    const jobs = 24;
    let running = 0;
    let most = 0;
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const w = worker([queue], { concurrency: 12 });
    w.handle("ts.gated", async (job) => {
      running += 1;
      most = Math.max(most, running);
      await gate;
      running -= 1;
      return job.id;
    });
    const acksBefore = await requests("/v1/acks");
    const completesBefore = await requests("/v1/jobs/{id}/complete");
    const submitted = await client.submitBatch(Array.from({ length: jobs }, () => ({ queue, type: "ts.gated" })));
    const run = serving(w);
    try {
      await until(() => running === 12, "12 handlers running");
      release();
      for (const { id } of submitted) assert.equal((await jobInState(client, id, "COMPLETED")).result, id);
    } finally {
      await run.stop();
    }
    assert.equal(most, 12);
    const ackRequests = (await requests("/v1/acks")) - acksBefore;
    assert.ok(ackRequests >= 1 && ackRequests <= jobs / 3, `${jobs} outcomes took ${ackRequests} ack requests`);
    assert.equal((await requests("/v1/jobs/{id}/complete")) - completesBefore, 0);
  });

  test("a job with dependencies gets the results of those that completed", async () => {
    const queue = queueName("ts-dependency-results");
    const seen = new Map<string, Readonly<Record<string, unknown>>>();
    const w = worker([queue]);
    w.handle<{ n: number }>("ts.step", (job) => {
      seen.set(job.id, job.dependencyResults);
      return { n: job.payload.n };
    });
    const [a, b, join] = await client.submitBatch([
      { queue, type: "ts.step", payload: { n: 1 }, ref: "a" },
      { queue, type: "ts.step", payload: { n: 2 }, ref: "b" },
      { queue, type: "ts.step", payload: { n: 3 }, depends_on: ["ref:a", "ref:b"] },
    ]);
    const run = serving(w);
    try {
      await jobInState(client, join!.id, "COMPLETED");
    } finally {
      await run.stop();
    }
    assert.deepEqual(seen.get(a!.id), {});
    assert.deepEqual(seen.get(join!.id), { [a!.id]: { n: 1 }, [b!.id]: { n: 2 } });
  });

  test("a token the dispatcher refuses ends serve() with the error", async () => {
    const w = worker([queueName("ts-refused")], { token: "not-a-worker-token" });
    w.handle("ts.any", () => null);
    const error = await w.serve().catch((e) => e);
    assert.ok(error instanceof UnauthorizedError, String(error));
    assert.equal(error.code, "unauthorized");
  });
});
