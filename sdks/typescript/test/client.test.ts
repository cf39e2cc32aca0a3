// `Client` against the real api: every endpoint, and the typed errors its problems become.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { describe, test } from "node:test";
import {
  Client,
  ConflictError,
  DispatcherClient,
  ForbiddenError,
  IdempotencyConflictError,
  InvalidStateError,
  JobNotFoundError,
  LimitNotFoundError,
  QueueFullError,
  QueueNotFoundError,
  RequestValidationError,
  ScheduleNotFoundError,
  UnauthorizedError,
} from "../src/index.js";
import { admin, env, FAST, producer, queueName, until } from "./support.js";

/** Claims the queue's next job and fails it for good, so it lands in the DLQ. */
async function deadLetter(queue: string, jobId: string): Promise<void> {
  const dispatcher = new DispatcherClient({ url: env.dispatcherUrl, token: env.workerToken, backoff: FAST });
  const [claimed] = await dispatcher.claim({ worker_id: "ts-test", queues: [queue], max_jobs: 1, wait_seconds: 5 });
  assert.equal(claimed?.id, jobId);
  const failed = await dispatcher.fail(jobId, claimed.lease_token, { message: "boom", type: "Test", retryable: false });
  assert.equal(failed.state, "DLQ");
}

describe("Client", () => {
  const client = producer();
  const root = admin();

  test("submit creates a job with the given fields and get returns it", async () => {
    const queue = queueName("ts-submit");
    const submitted = await client.submit(queue, "ts.echo", { n: 1 }, { priority: 5, max_attempts: 2 });
    assert.equal(submitted.replayed, false);
    assert.equal(submitted.job.state, "PENDING");
    const job = await client.get(submitted.id);
    assert.deepEqual(
      [job.queue, job.type, job.payload, job.priority, job.max_attempts],
      [queue, "ts.echo", { n: 1 }, 5, 2],
    );
    const events = await client.events(submitted.id);
    assert.deepEqual(
      events.map((e) => e.event),
      ["submitted"],
    );
  });

  test("a batch with refs waits on its dependencies, and dependents lists them", async () => {
    const queue = queueName("ts-deps");
    const [a, b, c] = await client.submitBatch([
      { queue, type: "ts.echo", ref: "a" },
      { queue, type: "ts.echo", ref: "b", depends_on: ["ref:a"] },
      { queue, type: "ts.echo", depends_on: ["ref:a", "ref:b"], on_dependency_failure: "run" },
    ]);
    assert.deepEqual(
      [a?.job.state, b?.job.state, c?.job.state],
      ["PENDING", "WAITING", "WAITING"],
    );
    assert.deepEqual(c?.job.depends_on, [a?.id, b?.id]);
    const first = await client.dependents(a!.id, { limit: 1 });
    assert.deepEqual(first.jobs.map((j) => j.id), [b?.id]);
    assert.ok(first.next);
    const rest = await client.dependents(a!.id, { after: first.next! });
    assert.deepEqual(rest.jobs.map((j) => j.id), [c?.id]);
    assert.equal(rest.next, null);
  });

  test("an idempotency key replays the same job, and conflicts on other fields", async () => {
    const queue = queueName("ts-idem");
    const key = randomUUID();
    const first = await client.submit(queue, "ts.echo", { a: 1 }, { idempotency_key: key });
    const again = await client.submit(queue, "ts.echo", { a: 1 }, { idempotency_key: key });
    assert.equal(first.replayed, false);
    assert.equal(again.replayed, true);
    assert.equal(again.id, first.id);
    const conflict = await client.submit(queue, "ts.echo", { a: 2 }, { idempotency_key: key }).catch((e) => e);
    assert.ok(conflict instanceof IdempotencyConflictError, String(conflict));
    assert.ok(conflict instanceof ConflictError);
    assert.equal(conflict.status, 409);
    assert.equal(conflict.code, "idempotency_conflict");
  });

  test("a debounce key absorbs the next submission, a throttle key answers with its job", async () => {
    const queue = queueName("ts-debounce");
    const debounce = { key: randomUUID(), delay_seconds: 60, max_delay_seconds: 600 };
    const first = await client.submit(queue, "ts.echo", { n: 1 }, { debounce });
    const again = await client.submit(queue, "ts.echo", { n: 2 }, { debounce });
    assert.deepEqual([first.debounced, first.replayed], [false, false]);
    assert.deepEqual([again.id, again.debounced, again.replayed], [first.id, true, false]);
    assert.deepEqual(again.job.payload, { n: 2 });
    const throttle = { key: randomUUID(), window_seconds: 60 };
    const results = await client.submitBatch([0, 1].map((n) => ({ queue, type: "ts.echo", payload: n, throttle })));
    const [made, answered] = [results[0]!, results[1]!];
    assert.deepEqual([made.throttled, answered.throttled, answered.replayed], [false, true, false]);
    assert.equal(answered.id, made.id);
  });

  test("submitBatch stores all in order, and an invalid item stores nothing", async () => {
    const queue = queueName("ts-batch");
    const results = await client.submitBatch([0, 1, 2].map((n) => ({ queue, type: "ts.echo", payload: n })));
    assert.deepEqual(
      await Promise.all(results.map(async (r) => (await client.get(r.id)).payload)),
      [0, 1, 2],
    );
    const invalid = await client
      .submitBatch([
        { queue, type: "ts.echo" },
        { queue, type: "ts.echo", max_attempts: 0 },
      ])
      .catch((e) => e);
    assert.ok(invalid instanceof RequestValidationError, String(invalid));
    assert.equal(invalid.code, "validation_error");
    assert.equal(invalid.status, 422);
    assert.ok(
      invalid.errors.some((e) => JSON.stringify(e.loc).includes("1")),
      JSON.stringify(invalid.errors),
    );
    const page = await root.listJobs({ queue });
    assert.equal(page.jobs.length, 3);
  });

  test("listJobs pages newest first and iterJobs walks every page", async () => {
    const queue = queueName("ts-list");
    const ids = (await client.submitBatch([0, 1, 2, 3, 4].map((n) => ({ queue, type: "ts.echo", payload: n })))).map(
      (r) => r.id,
    );
    const first = await root.listJobs({ queue, limit: 2 });
    assert.equal(first.jobs.length, 2);
    assert.notEqual(first.next, null);
    const all: string[] = [];
    for await (const job of root.iterJobs({ queue, limit: 2 })) all.push(job.id);
    assert.deepEqual(new Set(all), new Set(ids));
    assert.equal(all.length, 5);
    const pending = await root.listJobs({ queue, state: "COMPLETED" });
    assert.deepEqual(pending.jobs, []);
  });

  test("cancel a pending job; cancelling it again is invalid_state", async () => {
    const queue = queueName("ts-cancel");
    const { id } = await client.submit(queue, "ts.echo");
    assert.equal((await client.cancel(id)).state, "CANCELLED");
    const again = await client.cancel(id).catch((e) => e);
    assert.ok(again instanceof InvalidStateError, String(again));
    assert.equal(again.code, "invalid_state");
    assert.equal(again.attempts, 1);
  });

  test("retry, discard and redrive move DLQ jobs", async () => {
    const queue = queueName("ts-dlq");
    const { id } = await client.submit(queue, "ts.echo", null, { max_attempts: 1 });
    await deadLetter(queue, id);
    assert.equal((await root.retry(id)).state, "PENDING");
    await deadLetter(queue, id);
    assert.equal(await root.redrive(queue, { type: "ts.echo" }), 1);
    await deadLetter(queue, id);
    assert.equal((await root.discard(id)).state, "CANCELLED");
    const notDlq = await root.retry(id).catch((e) => e);
    assert.ok(notDlq instanceof InvalidStateError, String(notDlq));
    const failures = await root.failures(queue);
    assert.equal(failures.queue, queue);
  });

  test("pause and resume a queue; stats, queues and workers come from the read models", async () => {
    const queue = queueName("ts-stats");
    await client.submit(queue, "ts.echo");
    assert.deepEqual(await root.pause(queue), { queue, paused: true });
    let stats = await root.stats(queue).catch(() => null);
    await until(async () => {
      stats = await root.stats(queue).catch(() => null);
      return stats?.paused === true && stats.counts.PENDING === 1;
    }, "the projector shows the paused queue with its job");
    assert.deepEqual(await root.resume(queue), { queue, paused: false });
    const queues = await root.queues();
    assert.ok(queues.some((q) => q.queue === queue));
    assert.ok(Array.isArray(await root.workers()));
    // no pipeline runs here: the live totals alone, beside no analytics
    const analytics = await root.analytics();
    assert.equal(analytics.ran, false);
    assert.equal(analytics.next, null);
    const mine = analytics.queues.find((q) => q.queue === queue);
    assert.equal(mine?.pipeline, null);
    assert.equal(mine?.agree, false);
    assert.equal(mine?.projector?.totals.submitted, 1);
    assert.deepEqual(await root.queueAnalytics(queue), { queue, ran: false, as_of: null, types: [], next: null });
    const missing = await root.stats(queueName("ts-never")).catch((e) => e);
    assert.ok(missing instanceof QueueNotFoundError, String(missing));
    assert.equal(missing.code, "queue_not_found");
  });

  test("problems become typed errors with their code and status", async () => {
    const unknown = await client.get(randomUUID()).catch((e) => e);
    assert.ok(unknown instanceof JobNotFoundError, String(unknown));
    assert.deepEqual([unknown.status, unknown.code], [404, "job_not_found"]);

    const forbidden = await client.listJobs().catch((e) => e);
    assert.ok(forbidden instanceof ForbiddenError, String(forbidden));
    assert.deepEqual([forbidden.status, forbidden.code], [403, "forbidden"]);

    const stranger = new Client({ url: env.apiUrl, token: "not-a-token-at-all", backoff: FAST });
    const unauthorized = await stranger.get(randomUUID()).catch((e) => e);
    assert.ok(unauthorized instanceof UnauthorizedError, String(unauthorized));
    assert.equal(unauthorized.status, 401);

    const invalid = await client.submit("not a queue!", "ts.echo").catch((e) => e);
    assert.ok(invalid instanceof RequestValidationError, String(invalid));
    assert.ok(invalid.errors.length > 0);
  });

  test("schedules: put, read, pause, resume, trigger and delete", async () => {
    const name = queueName("ts-sched");
    const queue = queueName("ts-sched-q");
    const body = { cron: "0 9 * * *", timezone: "Europe/Berlin", job: { queue, type: "ts.echo" } };
    const first = await root.putSchedule(name, body);
    assert.equal(first.created, true);
    assert.deepEqual([first.schedule.name, first.schedule.cron, first.schedule.timezone], [name, "0 9 * * *", "Europe/Berlin"]);
    assert.equal((await root.putSchedule(name, { ...body, misfire: "skip" })).created, false);
    assert.equal((await root.schedule(name)).misfire, "skip");
    assert.ok((await root.schedules()).some((s) => s.name === name));
    assert.equal((await root.pauseSchedule(name)).paused, true);
    assert.equal((await root.resumeSchedule(name)).paused, false);
    const job = await root.triggerSchedule(name);
    assert.deepEqual([job.queue, job.type, job.state], [queue, "ts.echo", "PENDING"]);
    assert.equal((await root.schedule(name)).last_job_id, job.id);
    const badCron = await root.putSchedule(name, { ...body, cron: "61 * * * *" }).catch((e) => e);
    assert.ok(badCron instanceof RequestValidationError, String(badCron));
    await root.deleteSchedule(name);
    const gone = await root.schedule(name).catch((e) => e);
    assert.ok(gone instanceof ScheduleNotFoundError, String(gone));
    assert.deepEqual([gone.status, gone.code], [404, "schedule_not_found"]);
  });

  test("limits: set, list, read usage and delete", async () => {
    const stem = queueName("ts-tenant");
    const queue = queueName("ts-limits-q");
    const made = await root.setLimit(`${stem}:*`, { concurrency: 2, rate: { limit: 10, per_seconds: 60 } });
    assert.deepEqual([made.created, made.limit.concurrency], [true, 2]);
    assert.equal((await root.setLimit(`${stem}:*`, { concurrency: 3, rate: null })).created, false);
    assert.ok((await root.limits()).some((l) => l.key === `${stem}:*`));
    const job = await client.submit(queue, "ts.echo", {}, { limit_keys: [`${stem}:1`] });
    assert.deepEqual(job.job.limit_keys, [`${stem}:1`]);
    const usage = await root.limit(`${stem}:1`);
    assert.deepEqual([usage.governed_by, usage.concurrency, usage.running], [`${stem}:*`, 3, 0]);
    await root.deleteLimit(`${stem}:*`);
    const gone = await root.limit(`${stem}:1`).catch((e) => e);
    assert.ok(gone instanceof LimitNotFoundError, String(gone));
    assert.deepEqual([gone.status, gone.code], [404, "limit_not_found"]);
  });

  test("admission: max_pending, room and QueueFullError", async () => {
    const key = `${queueName("ts-admit")}:1`;
    const queue = queueName("ts-admit-q");
    const made = await root.setLimit(key, { concurrency: null, rate: null, max_pending: 1 });
    assert.equal(made.limit.max_pending, 1);
    assert.equal(await client.room(key), 1);
    await client.submit(queue, "ts.echo", {}, { limit_keys: [key] });
    assert.equal(await client.room(key), 0);
    const refused = await client.submit(queue, "ts.echo", {}, { limit_keys: [key] }).catch((e) => e);
    assert.ok(refused instanceof QueueFullError, String(refused));
    assert.deepEqual([refused.status, refused.code], [429, "queue_full"]);
    await root.deleteLimit(key);
  });

  test("history: a queue's per-minute series and every queue's", async () => {
    const queue = queueName("ts-history");
    await client.submit(queue, "ts.echo");
    let submitted = 0;
    await until(async () => {
      const history = await root.history(queue, 5).catch(() => null);
      submitted = history === null ? 0 : history.submitted.reduce((a, b) => a + b, 0);
      return submitted === 1;
    }, "the projector counts the submission in the queue's history");
    const one = await root.history(queue, 5);
    assert.equal(one.submitted.length, 5);
    const all = await root.histories(5);
    assert.ok(all.some((h) => h.queue === queue));
  });
});
