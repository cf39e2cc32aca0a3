// The TypeScript SDK of Evora: `Client` for producers and admins, `Worker` for worker
// processes (and `DispatcherClient` beneath it), and the errors both throw.
export { RetryBackoff, sleep, type BackoffOptions } from "./backoff.js";
export { Client, CLIENT_METHODS, type ClientOptions, type JobPage, type SubmitResult } from "./client.js";
export { DispatcherClient, DISPATCHER_METHODS, type CallOptions, type DispatcherClientOptions } from "./dispatcher.js";
export * from "./errors.js";
export type * from "./types.js";
export { WorkerJob } from "./job.js";
export { consoleLogger, type Logger, type LogLevel } from "./logger.js";
export { Worker, type Handler, type WorkerEvents, type WorkerOptions } from "./worker.js";
