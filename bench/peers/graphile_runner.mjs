// graphile-worker's runner process: the modes of bench/runnerkit.py, in Node.
//
// Producer: WorkerUtils.addJobs (one call per batch of 1,000) and WorkerUtils.addJob for
// single jobs (its pg pool: 10 connections). Worker: run() in the tuned configuration:
// concurrency 10 (100 when handlers take time: --handler-ms), localQueue.size 100 (one query fetches and locks up to 100 jobs) and
// completeJobBatchDelay 0 (completions of one tick coalesced into one statement); the rest
// is graphile-worker's default. Its info logging is dropped (warnings and errors kept) so
// that console output is not what gets measured.
//
//   node graphile_runner.mjs --dsn DSN MODE --out F [--count N --batch B --rate R
//                            --seconds S --first K --handler-ms H]

import { readFileSync, renameSync, writeFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { Logger, makeWorkerUtils, run } from "graphile-worker";

const JOB_TYPE = "bench_noop";
const LOCAL_QUEUE_SIZE = 100;

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    dsn: { type: "string" },
    out: { type: "string" },
    count: { type: "string", default: "0" },
    batch: { type: "string", default: "1000" },
    rate: { type: "string", default: "200" },
    seconds: { type: "string", default: "20" },
    first: { type: "string", default: "0" },
    "handler-ms": { type: "string", default: "0" },
  },
});
const mode = positionals[0];

// Wall clock with sub-millisecond resolution, in seconds (Python's time.time()).
const now = () => (performance.timeOrigin + performance.now()) / 1000;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

const quiet = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`${level}: ${message}`);
});

function writeJson(path, data) {
  writeFileSync(`${path}.tmp`, JSON.stringify(data));
  renameSync(`${path}.tmp`, path);
}

async function withUtils(body) {
  const utils = await makeWorkerUtils({ connectionString: values.dsn, logger: quiet });
  try {
    return await body(utils);
  } finally {
    await utils.release();
  }
}

async function enqueue() {
  const count = Number(values.count);
  const batch = Number(values.batch);
  return withUtils(async (utils) => {
    const tStart = now();
    for (let first = 0; first < count; first += batch) {
      const jobs = [];
      for (let i = first; i < Math.min(first + batch, count); i++) {
        jobs.push({ identifier: JOB_TYPE, payload: { i } });
      }
      await utils.addJobs(jobs);
    }
    return { t_start: tStart, t_end: now(), count };
  });
}

async function offer() {
  const rate = Number(values.rate);
  const total = Math.round(rate * Number(values.seconds));
  const first = Number(values.first);
  return withUtils(async (utils) => {
    const sent = [];
    const calls = [];
    const t0 = performance.now();
    for (let j = 0; j < total; j++) {
      const delay = t0 + (j * 1000) / rate - performance.now();
      if (delay > 0) await sleep(delay);
      const i = first + j;
      calls.push(
        (async () => {
          const tCall = now();
          await utils.addJob(JOB_TYPE, { i });
          sent.push([i, tCall, now()]);
        })(),
      );
    }
    await Promise.all(calls);
    return { sent };
  });
}

async function work() {
  const starts = [];
  const handlerMs = Number(values["handler-ms"]);
  // Tuned for no-op jobs, concurrency 10 is best; jobs that take time (--handler-ms) get
  // as many at once as the other systems' workers run (100), else 10 would be the limit.
  const concurrency = handlerMs > 0 ? 100 : 10;
  const runner = await run({
    connectionString: values.dsn,
    concurrency,
    noHandleSignals: true,
    logger: quiet,
    preset: {
      worker: { localQueue: { size: LOCAL_QUEUE_SIZE }, completeJobBatchDelay: 0 },
    },
    taskList: {
      [JOB_TYPE]: async (payload) => {
        starts.push([typeof payload?.i === "number" ? payload.i : -1, now()]);
        if (handlerMs > 0) await sleep(handlerMs);
      },
    },
  });
  console.log("READY");
  await new Promise((resolve) => {
    process.once("SIGTERM", resolve);
    process.once("SIGINT", resolve);
  });
  await runner.stop();
  return { starts };
}

async function setup() {
  await withUtils((utils) => utils.migrate());
  return {};
}

const modes = { setup, enqueue, offer, work };
// The mode's own CPU, as the Python runners report it: starting Node and loading the
// modules is not work per job.
const started = process.cpuUsage();
const result = await modes[mode]();
const usage = process.cpuUsage(started);
result.cpu_seconds = (usage.user + usage.system) / 1e6;
// VmHWM, not resourceUsage().maxRSS: Linux carries getrusage's peak across exec, so a
// process started by a larger one would report at least its parent's peak.
const hwm = readFileSync("/proc/self/status", "utf8").match(/^VmHWM:\s+(\d+)/m);
result.maxrss_kib = hwm ? Number(hwm[1]) : 0;
writeJson(values.out, result);
process.exit(0);
