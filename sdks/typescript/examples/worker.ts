// An example worker: `npm run build && node dist/examples/worker.js` with `evora dev`
// running (it prints the URLs and tokens; set EVORA_DISPATCHER_URL and EVORA_WORKER_TOKEN).
// In your own project, import from "evora-queue" instead of "../src/index.js".
import { NonRetryableError, Worker, type WorkerJob } from "../src/index.js";

interface Email {
  to: string;
  subject: string;
}

const worker = new Worker({
  url: process.env.EVORA_DISPATCHER_URL ?? "http://127.0.0.1:8081",
  token: process.env.EVORA_WORKER_TOKEN ?? "",
  queues: ["emails"],
  concurrency: 20,
  gracePeriodMs: 30_000,
});

worker.handle("email.send", async (job: WorkerJob<Email>) => {
  if (!job.payload.to.includes("@")) {
    // Retrying cannot fix this: straight to the DLQ.
    throw new NonRetryableError(`not an address: ${job.payload.to}`);
  }
  job.progress({ stage: "sending" });
  // Pass the job's signal on: it aborts when the job is cancelled, when the worker stops
  // past its grace period, or when the lease was lost.
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(resolve, 200);
    job.signal.addEventListener("abort", () => {
      clearTimeout(timer);
      reject(job.signal.reason);
    });
  });
  return { sent_to: job.payload.to, attempt: job.attempt };
});

worker.on("leaseLost", (job) => console.warn(`job ${job.id} was taken over by another attempt`));

// Serves until SIGTERM or SIGINT, then finishes in-flight jobs within the grace period.
await worker.run();
