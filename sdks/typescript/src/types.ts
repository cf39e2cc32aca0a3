// The wire types under the names the SDK uses. They come from src/generated/, which is
// generated from the services' /openapi.json (tools/generate.ts) and checked against the
// running services by test/openapi.test.ts, so they cannot drift from the server.

import type * as api from "./generated/api.js";
import type * as dispatcher from "./generated/dispatcher.js";

/** A job as the api returns it. */
export type Job = api.JobResponse;
export type JobState = api.JobState;
export type JobEvent = api.JobEvent;
export type QueueStats = api.QueueStats;
export type QueuePauseState = api.QueuePauseState;
export type WorkerActivity = api.WorkerActivity;
export type FailureList = api.FailureList;
export type Backoff = api.Backoff;

/** The fields of `POST /v1/jobs`. */
export type Submission = api.JobSubmission;
/** The optional submission fields; omitted ones take the server's defaults. */
export type SubmitOptions = Omit<Submission, "queue" | "type" | "payload">;
export type JobListQuery = api.JobListQuery;
export type RedriveRequest = api.RedriveRequest;

/** A job handed out by `POST /v1/claim`, with the lease token of this claim. */
export type ClaimedJob = dispatcher.ClaimedJob;
/** The callback a job is suspended on, or was last (docs/callbacks.md). */
export type Callback = api.Callback;
/** A callback's resolution: the same for the first one and every repeat. */
export type CallbackResolution = api.CallbackResolution;
export type SuspendResponse = dispatcher.SuspendResponse;
export type ChildrenResponse = dispatcher.ChildrenResponse;
export type ClaimRequest = dispatcher.ClaimRequest;
export type HeartbeatResponse = dispatcher.HeartbeatResponse;
/** The `error` of a fail report. */
export type ErrorBody = dispatcher.ErrorBody;
/** An upstream's rate-limit answer on a failure (`RetryAfter`; docs/flow-control.md). */
export type RetryAfterBody = dispatcher.RetryAfter;
export type AckItem = dispatcher.Ack;
export type AckResult = dispatcher.AckResult;
/** A job as the dispatcher returns it after complete, fail or release. */
export type DispatchedJob = dispatcher.Job;

export type ApiOperation = api.Operation;
export type DispatcherOperation = dispatcher.Operation;
