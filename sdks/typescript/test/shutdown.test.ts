// Graceful shutdown: stop claiming, let in-flight jobs finish within the grace period,
// release the rest (claimable again, the attempt not counted); and SIGTERM to a process
// serving `worker.run()`.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { describe, test } from "node:test";
import { WorkerShutdownError } from "../src/index.js";
import { env, jobInState, producer, queueName, serving, until, worker } from "./support.js";

describe("shutdown", () => {
  const client = producer();

  test("in-flight jobs finish within the grace period and nothing more is claimed", async () => {
    const queue = queueName("ts-stop");
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const started: string[] = [];
    const w = worker([queue], { concurrency: 2, gracePeriodMs: 20_000 });
    w.handle("ts.gated", async (job) => {
      started.push(job.id);
      await gate;
      return "finished";
    });
    const ids = (await client.submitBatch([1, 2, 3].map((priority) => ({ queue, type: "ts.gated", priority })))).map(
      (r) => r.id,
    );
    const run = serving(w);
    await until(() => started.length === 2, "both slots busy");
    const began = Date.now();
    const stopping = run.stop();
    release();
    await stopping;
    assert.ok(Date.now() - began < 10_000, "stop() waited for no more than the jobs");
    for (const id of ids.slice(0, 2)) assert.equal((await client.get(id)).state, "COMPLETED");
    const third = await client.get(ids[2]!);
    assert.deepEqual([third.state, third.attempt], ["PENDING", 0]);
  });

  test("a job still running after the grace period is released and claimable again", async () => {
    const queue = queueName("ts-grace");
    let reason: unknown;
    let started = false;
    const w = worker([queue], { gracePeriodMs: 300 });
    w.handle("ts.stuck", async (job) => {
      started = true;
      // Honours the signal only to note why it fired; the job is released either way.
      await new Promise((resolve) => job.signal.addEventListener("abort", resolve, { once: true }));
      reason = job.signal.reason;
      return "ignored";
    });
    const run = serving(w);
    const { id } = await client.submit(queue, "ts.stuck");
    await until(() => started, "the handler started");
    await run.stop();
    assert.ok(reason instanceof WorkerShutdownError, String(reason));
    const released = await client.get(id);
    assert.deepEqual([released.state, released.attempt, released.result], ["PENDING", 0, null]);
    assert.deepEqual(
      (await client.events(id)).map((e) => e.event),
      ["submitted", "claimed", "released"],
    );

    const next = worker([queue]);
    next.handle("ts.stuck", (job) => ({ attempt: job.attempt }));
    const again = serving(next);
    try {
      assert.deepEqual((await jobInState(client, id, "COMPLETED")).result, { attempt: 1 });
    } finally {
      await again.stop();
    }
  });

  test("SIGTERM to a worker process lets its job finish, then the process exits 0", async () => {
    const queue = queueName("ts-sigterm");
    const child = spawn(process.execPath, [new URL("./fixtures/sigterm-worker.js", import.meta.url).pathname], {
      env: { ...process.env, EVORA_TEST_QUEUE: queue, HANDLER_MS: "1000" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let output = "";
    child.stdout.on("data", (chunk) => (output += chunk));
    child.stderr.on("data", (chunk) => (output += chunk));
    const exited = once(child, "exit");
    try {
      const { id } = await client.submit(queue, "ts.sigterm");
      await jobInState(client, id, "RUNNING");
      child.kill("SIGTERM");
      const [code] = await exited;
      assert.equal(code, 0, output);
      const job = await client.get(id);
      assert.deepEqual([job.state, job.result], ["COMPLETED", { finished: id }], output);
      assert.match(output, /SIGTERM: stopping/);
      assert.match(output, /worker stopped/);
    } finally {
      if (child.exitCode === null) child.kill("SIGKILL");
    }
    void env;
  });
});
