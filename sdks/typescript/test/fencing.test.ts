// Lease fencing: a stale lease token gets 409 lease_lost, which the SDK surfaces as a
// `LeaseLostError`; a worker whose lease ran out under a running handler aborts the
// handler's signal with that error, emits "leaseLost", and reports nothing for it.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { DispatcherClient, LeaseLostError, type WorkerJob } from "../src/index.js";
import { env, FAST, jobInState, producer, queueName, serving, until, work, worker } from "./support.js";

describe("fencing", () => {
  const client = producer();

  test("a stale lease token gets LeaseLostError; the current one completes, twice alike", async () => {
    const queue = queueName("ts-fence");
    const dispatcher = new DispatcherClient({ url: env.dispatcherUrl, token: env.workerToken, backoff: FAST });
    const { id } = await client.submit(queue, "ts.fence");
    const claim = async () => {
      const [job] = await dispatcher.claim({ worker_id: "ts-fence", queues: [queue], max_jobs: 1, wait_seconds: 5 });
      assert.equal(job?.id, id);
      return job.lease_token;
    };
    const stale = await claim();
    await dispatcher.release(id, stale);
    const current = await claim();
    assert.notEqual(stale, current);

    for (const call of [
      () => dispatcher.complete(id, stale, "stale"),
      () => dispatcher.fail(id, stale, { message: "stale" }),
      () => dispatcher.heartbeat(id, stale),
      () => dispatcher.release(id, stale),
    ]) {
      const error = await call().catch((e) => e);
      assert.ok(error instanceof LeaseLostError, String(error));
      assert.deepEqual([error.status, error.code], [409, "lease_lost"]);
    }
    const [staleAck] = await dispatcher.acks([{ id, lease_token: stale, outcome: "complete", result: "stale" }]);
    assert.deepEqual(staleAck, { id, status: 409 });

    const beat = await dispatcher.heartbeat(id, current, { progressJson: '{"half":true}' });
    assert.equal(beat.cancel_requested, false);
    const done = await dispatcher.complete(id, current, { by: "owner" });
    const again = await dispatcher.complete(id, current, { by: "owner" });
    assert.deepEqual([done.state, again.state, again.result], ["COMPLETED", "COMPLETED", { by: "owner" }]);
  });

  test("a lease that ran out under a handler aborts its signal with LeaseLostError", async () => {
    const queue = queueName("ts-lease-lost");
    const reasons = new Map<number, unknown>();
    const lost: Array<{ job: WorkerJob; during: string }> = [];
    const w = worker([queue], { concurrency: 2 });
    w.handle("ts.slow", async (job) => {
      if (job.attempt === 1) {
        // Blocks the event loop, so no heartbeat goes out and the 1 s lease runs out (the
        // sweeper notices within a fifth of a second; the rest is room for a loaded machine).
        const until = Date.now() + 3_500;
        while (Date.now() < until) {
          /* busy */
        }
        try {
          await work(30_000, job.signal);
        } catch (error) {
          reasons.set(job.attempt, error);
          throw error;
        }
      }
      return { attempt: job.attempt };
    });
    w.on("leaseLost", (job, during) => lost.push({ job, during }));
    const run = serving(w);
    try {
      const { id } = await client.submit(queue, "ts.slow", null, { lease_seconds: 1, max_attempts: 3 });
      const job = await jobInState(client, id, "COMPLETED", 30_000);
      assert.deepEqual(job.result, { attempt: 2 });
      await until(() => reasons.has(1), "the first attempt's signal aborted");
      const reason = reasons.get(1);
      assert.ok(reason instanceof LeaseLostError, String(reason));
      assert.equal(reason.code, "lease_lost");
      assert.ok(lost.some((entry) => entry.job.attempt === 1 && entry.during === "heartbeat"), JSON.stringify(lost.map((l) => l.during)));
      const events = (await client.events(id)).map((e) => e.event);
      assert.deepEqual(events, ["submitted", "claimed", "lease_expired", "claimed", "completed"]);
    } finally {
      await run.stop();
    }
  });
});
