// A hard time limit (`max_duration_seconds`, docs/jobs-that-wait.md): past it a heartbeat
// answers timeout_requested and the handler's signal aborts with JobTimeoutError; a handler
// that stops has its attempt failed by the worker (error type `timeout`), one that ignores
// the signal is failed by the sweeper once the grace (lease_seconds) is over.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { JobTimeoutError } from "../src/index.js";
import { jobInState, producer, queueName, serving, until, work, worker } from "./support.js";

describe("time limit", () => {
  const client = producer();
  const limited = { max_duration_seconds: 1, lease_seconds: 2, max_attempts: 1 };

  test("a handler that stops on the signal has its attempt failed with type timeout", async () => {
    const queue = queueName("ts-timeout-stop");
    let reason: unknown;
    let seen: [number | null, boolean] | undefined;
    const released: string[] = [];
    const w = worker([queue], { cancelGraceMs: 30_000 });
    w.handle("ts.long", async (job) => {
      try {
        await work(60_000, job.signal);
      } catch (error) {
        reason = error;
        seen = [job.maxDurationSeconds, job.timeoutRequested];
        throw error;
      }
    });
    w.on("released", (job, why) => released.push(`${job.id} ${why}`));
    const run = serving(w);
    try {
      const { id } = await client.submit(queue, "ts.long", null, limited);
      const dead = await jobInState(client, id, "DLQ");
      assert.ok(reason instanceof JobTimeoutError, String(reason));
      assert.deepEqual(seen, [1, true]);
      assert.deepEqual([dead.attempt, dead.last_error?.type], [1, "timeout"]);
      assert.deepEqual(released, []);
    } finally {
      await run.stop();
    }
  });

  test("a handler that ignores the signal is failed by the sweeper after the grace", async () => {
    const queue = queueName("ts-timeout-ignored");
    let finish!: () => void;
    const gate = new Promise<void>((resolve) => (finish = resolve));
    let started = false;
    const lost: string[] = [];
    const w = worker([queue], { cancelGraceMs: 60_000 });
    w.handle("ts.stubborn", async () => {
      started = true;
      await gate;
      return "too late";
    });
    w.on("leaseLost", (job, where) => lost.push(`${job.id} ${where}`));
    const run = serving(w);
    try {
      const { id } = await client.submit(queue, "ts.stubborn", null, limited);
      await until(() => started, "the stubborn handler started");
      const dead = await jobInState(client, id, "DLQ");
      assert.deepEqual([dead.attempt, dead.last_error?.type, dead.result], [1, "timeout", null]);
      // the next heartbeat finds the lease revoked
      await until(() => lost.length === 1, "the worker learns the lease is gone");
      assert.deepEqual(lost, [`${id} heartbeat`]);
    } finally {
      finish();
      await run.stop();
    }
  });
});
