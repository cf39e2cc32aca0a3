// Jobs the Python SDK submitted (tests/typescript/test_sdk.py), worked by a TypeScript
// worker; the Python side then checks their results.

import assert from "node:assert/strict";
import { test } from "node:test";
import { serving, until, worker } from "../support.js";

test("a TypeScript worker works the jobs Python submitted", async () => {
  const queue = process.env.EVORA_TEST_QUEUE;
  const count = Number(process.env.EVORA_TEST_JOB_COUNT);
  assert.ok(queue && count > 0, "EVORA_TEST_QUEUE and EVORA_TEST_JOB_COUNT are set by the harness");
  const w = worker([queue]);
  w.handle("interop.echo", (job) => ({ by: "typescript", echo: job.payload }));
  const done = new Set<string>();
  w.on("reported", (job, outcome) => {
    assert.equal(outcome, "complete");
    done.add(job.id);
  });
  const run = serving(w);
  await until(() => done.size === count, `${count} jobs completed`);
  await run.stop();
});
