// Jobs submitted with the TypeScript client and worked by a Python worker, which the
// harness (tests/typescript/test_sdk.py) runs meanwhile.

import assert from "node:assert/strict";
import { test } from "node:test";
import { jobInState, producer } from "../support.js";

const PAYLOADS: unknown[] = [{ n: 1 }, "text with ünïcode ✓", [1, [2, [3]]], null, 12.5, { nested: { a: [true, false] } }];

test("TypeScript submits, a Python worker completes with its result", async () => {
  const queue = process.env.EVORA_TEST_QUEUE;
  assert.ok(queue, "EVORA_TEST_QUEUE is set by the harness");
  const client = producer();
  const submitted = await client.submitBatch(PAYLOADS.map((payload) => ({ queue, type: "interop.echo", payload })));
  for (const [index, { id }] of submitted.entries()) {
    const job = await jobInState(client, id, "COMPLETED");
    assert.deepEqual(job.result, { by: "python", echo: PAYLOADS[index] });
  }
});
