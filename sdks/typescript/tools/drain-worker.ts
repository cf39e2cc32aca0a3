// The TypeScript side of bench/typescript_worker.py: one worker process with a no-op
// handler, the SDK's defaults except `concurrency`, printing READY once it claims and
// stopping gracefully on SIGTERM.
//
//   node dist/tools/drain-worker.js URL TOKEN QUEUE TYPE CONCURRENCY
import { Worker, consoleLogger } from "../src/index.js";

const [url, token, queue, type, concurrency] = process.argv.slice(2);
if (!url || !token || !queue || !type || !concurrency) {
  console.error("usage: drain-worker.js URL TOKEN QUEUE TYPE CONCURRENCY");
  process.exit(2);
}
const worker = new Worker({
  url,
  token,
  queues: [queue],
  concurrency: Number(concurrency),
  logger: consoleLogger("warn"),
});
worker.handle(type, () => null);
const running = worker.run();
console.log("READY");
await running;
