// `prefetch`: jobs claimed ahead of free slots, held until one frees.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { jobInState, producer, queueName, serving, until, worker } from "./support.js";

/** A gate handlers wait at until the test opens it. */
function gate(): { opened: Promise<void>; open: () => void } {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { opened, open };
}

describe("prefetch", () => {
  const client = producer();

  test("held jobs wait for a slot: no more than `concurrency` handlers run", async () => {
    const queue = queueName("ts-prefetch-slots");
    const { opened, open } = gate();
    const started: string[] = [];
    let running = 0;
    let most = 0;
    const w = worker([queue], { concurrency: 2, prefetch: 2 });
    w.handle("ts.held", async (job) => {
      started.push(job.id);
      running += 1;
      most = Math.max(most, running);
      await opened;
      running -= 1;
    });
    const run = serving(w);
    try {
      const ids = (await client.submitBatch(Array.from({ length: 6 }, () => ({ queue, type: "ts.held" })))).map(
        (s) => s!.id,
      );
      const states = async (): Promise<string[]> => Promise.all(ids.map(async (id) => (await client.get(id)).state));
      await until(async () => (await states()).filter((s) => s === "RUNNING").length === 4, "four jobs held");
      await until(() => started.length === 2, "two handlers running");
      assert.deepEqual((await states()).slice(4), ["PENDING", "PENDING"]);
      assert.equal(started.length, 2);
      open();
      for (const id of ids) await jobInState(client, id, "COMPLETED");
      assert.equal(most, 2);
      assert.deepEqual([...started].sort(), [...ids].sort());
    } finally {
      await run.stop();
    }
  });

  test("a held job whose cancel is requested never runs, and stop releases held jobs at once", async () => {
    const queue = queueName("ts-prefetch-cancel");
    const { opened, open } = gate();
    const started: string[] = [];
    const released: string[] = [];
    const w = worker([queue], { concurrency: 1, prefetch: 2, gracePeriodMs: 10_000 });
    w.handle("ts.held", async (job) => {
      started.push(job.id);
      await opened;
    });
    w.on("released", (job, why) => released.push(`${job.id} ${why}`));
    const run = serving(w);
    let stopping: Promise<void> | undefined;
    try {
      // A lease of 1 s: heartbeats, which learn of cancel requests, every third of a second.
      const [first, cancelled, held] = (
        await client.submitBatch([1, 2, 3].map(() => ({ queue, type: "ts.held", lease_seconds: 1 })))
      ).map((s) => s!.id);
      await until(() => started.length === 1, "the first job running");
      await jobInState(client, held!, "RUNNING");
      await client.cancel(cancelled!);
      await jobInState(client, cancelled!, "CANCELLED");
      stopping = run.stop();
      // The held job goes back while the running one still has its grace period.
      await jobInState(client, held!, "PENDING");
      assert.equal((await client.get(first!)).state, "RUNNING");
      open();
      await stopping;
      assert.equal((await client.get(first!)).state, "COMPLETED");
      assert.deepEqual(started, [first]);
      assert.deepEqual(released.sort(), [`${cancelled} cancel`, `${held} shutdown`].sort());
    } finally {
      open();
      await (stopping ?? run.stop());
    }
  });

  test("prefetch must not be negative", () => {
    assert.throws(() => worker(["q"], { prefetch: -1 }), /prefetch must not be negative/);
  });
});
