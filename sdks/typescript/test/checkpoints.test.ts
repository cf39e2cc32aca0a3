// Checkpoints (docs/jobs-that-wait.md): a step recorded with `job.checkpoint()` before the
// attempt failed is handed to the next attempt in `job.checkpoints`, which skips it.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { jobInState, producer, queueName, serving, worker } from "./support.js";

describe("checkpoints", () => {
  const client = producer();

  test("a retry resumes after the last checkpoint", async () => {
    const queue = queueName("ts-checkpoints");
    const charges: string[] = [];
    const runs: Record<string, unknown>[] = [];
    const w = worker([queue]);
    w.handle("ts.pay", async (job) => {
      runs.push({ ...job.checkpoints });
      if (!("charged" in job.checkpoints)) {
        charges.push("o-1");
        await job.checkpoint("charged", { charge: "ch_o-1" });
      }
      if (job.attempt === 1) throw new Error("crashed after charging");
      return { shippedWith: job.checkpoints.charged };
    });
    const run = serving(w);
    try {
      const { id } = await client.submit(queue, "ts.pay", null, {
        backoff: { initial_seconds: 0.001, max_seconds: 0.001 },
      });
      const done = await jobInState(client, id, "COMPLETED");
      assert.deepEqual(charges, ["o-1"]);
      assert.deepEqual(runs, [{}, { charged: { charge: "ch_o-1" } }]);
      assert.deepEqual([done.attempt, done.result], [2, { shippedWith: { charge: "ch_o-1" } }]);
      assert.deepEqual(done.checkpoints, { charged: { charge: "ch_o-1" } });
    } finally {
      await run.stop();
    }
  });
});
