// Cancelling a running job: the heartbeat learns of it and the handler's AbortSignal fires.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { JobCancelledError } from "../src/index.js";
import { jobInState, producer, queueName, serving, until, work, worker } from "./support.js";

describe("cancel", () => {
  const client = producer();

  test("the handler's signal aborts with JobCancelledError and the job ends CANCELLED", async () => {
    const queue = queueName("ts-cancel-run");
    let started = false;
    let reason: unknown;
    const released: string[] = [];
    const w = worker([queue]);
    w.handle("ts.long", async (job) => {
      started = true;
      try {
        await work(60_000, job.signal);
      } catch (error) {
        reason = error;
        assert.equal(job.cancelRequested, true);
        throw error;
      }
    });
    w.on("released", (job, why) => released.push(`${job.id} ${why}`));
    const run = serving(w);
    try {
      const { id } = await client.submit(queue, "ts.long", null, { lease_seconds: 2 });
      await until(() => started, "the handler started");
      const requested = await client.cancel(id);
      assert.deepEqual([requested.state, requested.cancel_requested], ["RUNNING", true]);
      await jobInState(client, id, "CANCELLED");
      assert.ok(reason instanceof JobCancelledError, String(reason));
      assert.deepEqual(released, [`${id} cancel`]);
    } finally {
      await run.stop();
    }
  });

  test("a handler that ignores the signal is given up on; its slot stays taken until it settles", async () => {
    const queue = queueName("ts-cancel-ignored");
    let finish!: () => void;
    const gate = new Promise<void>((resolve) => (finish = resolve));
    const started: string[] = [];
    const w = worker([queue], { concurrency: 1, cancelGraceMs: 200 });
    w.handle("ts.stubborn", async (job) => {
      started.push(job.id);
      await gate;
      return "too late";
    });
    w.handle("ts.next", (job) => {
      started.push(job.id);
      return "next";
    });
    const run = serving(w);
    try {
      const { id } = await client.submit(queue, "ts.stubborn", null, { lease_seconds: 1 });
      await until(() => started.length === 1, "the stubborn handler started");
      await client.cancel(id);
      const cancelled = await jobInState(client, id, "CANCELLED");
      assert.equal(cancelled.result, null);
      const next = await client.submit(queue, "ts.next");
      // The only slot still belongs to the stubborn handler: nothing else is claimed.
      await new Promise((resolve) => setTimeout(resolve, 500));
      assert.equal((await client.get(next.id)).state, "PENDING");
      finish();
      await jobInState(client, next.id, "COMPLETED");
      assert.equal((await client.get(id)).state, "CANCELLED");
    } finally {
      await run.stop();
    }
  });
});
