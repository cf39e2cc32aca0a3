// The dispatcher restarts under a running worker: claims fail and are retried with capped
// exponential backoff and jitter, an outcome that could not be sent meanwhile is sent once
// the dispatcher is back, and new jobs are worked again.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { RetryBackoff } from "../src/index.js";
import { jobInState, producer, queueName, restartDispatcher, serving, until, worker } from "./support.js";

describe("reconnect", () => {
  const client = producer();

  test("a worker carries on after the dispatcher restarts", async () => {
    const queue = queueName("ts-restart");
    const delays: number[] = [];
    let reconnected = 0;
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let started = false;
    const backoff = new RetryBackoff({ initialMs: 50, maxMs: 400 });
    const w = worker([queue], { waitSeconds: 2, backoff });
    w.handle("ts.across", async (job) => {
      started = true;
      await gate;
      return { attempt: job.attempt };
    });
    w.handle("ts.after", () => "after");
    w.on("claimFailed", (_error, delay) => delays.push(delay));
    w.on("reconnected", () => (reconnected += 1));
    const run = serving(w);
    try {
      const across = await client.submit(queue, "ts.across", null, { lease_seconds: 60 });
      await until(() => started, "the first job's handler started");
      const restarting = restartDispatcher(2);
      await until(() => delays.length > 0, "a claim failed while the dispatcher is down");
      // Finishes while the dispatcher is down: its outcome waits and is retried.
      release();
      await restarting;
      assert.deepEqual((await jobInState(client, across.id, "COMPLETED")).result, { attempt: 1 });
      const after = await client.submit(queue, "ts.after");
      assert.equal((await jobInState(client, after.id, "COMPLETED")).result, "after");
      assert.ok(reconnected >= 1, "reconnected was emitted");
      assert.ok(
        delays.every((delay) => delay >= 25 && delay <= 400),
        `delays within the backoff's bounds: ${delays.map(Math.round).join(", ")}`,
      );
    } finally {
      await run.stop();
    }
  });

  test("a worker backing off claims again within a probe of the dispatcher being back", async () => {
    const queue = queueName("ts-probe");
    // Far longer than the restart: without readiness probes the worker would sleep 10-20 s
    // after its first failed claim, whatever happened meanwhile.
    const backoff = new RetryBackoff({ initialMs: 20_000, maxMs: 20_000 });
    const w = worker([queue], { waitSeconds: 1, backoff });
    let failed = 0;
    w.handle("ts.probe", () => "ran");
    w.on("claimFailed", () => (failed += 1));
    const run = serving(w);
    try {
      const restarting = restartDispatcher(2);
      await until(() => failed > 0, "a claim failed while the dispatcher is down");
      await restarting;
      const back = Date.now();
      const job = await client.submit(queue, "ts.probe");
      assert.equal((await jobInState(client, job.id, "COMPLETED")).result, "ran");
      const took = Date.now() - back;
      assert.ok(took < 5_000, `ran ${took} ms after the dispatcher was back`);
    } finally {
      await run.stop();
    }
  });
});
