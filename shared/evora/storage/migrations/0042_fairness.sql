-- Evora schema, version 42: weighted fair scheduling across fairness keys
-- (docs/flow-control.md, "Fairness keys"). A job may carry a `fairness_key` (its tenant); a
-- queue that has ever received one is claimed by evora.claim_fair()
-- (functions/fairness.sql), which serves its keys by start-time fair queuing over virtual
-- time, charged with the lease time each key's jobs actually held.
ALTER TABLE evora.jobs ADD COLUMN fairness_key text;

-- the submission's field (evora.validated())
ALTER TYPE evora.submission ADD ATTRIBUTE fairness_key text;

-- The PENDING and WAITING jobs of each key, in the order a key's own jobs are claimed (the
-- claim reads a key's head through it; WAITING too, so that "does the key still have work"
-- is one probe). Jobs without a key are not in it: the unkeyed claim never reads it, and
-- unkeyed submissions do not write it.
CREATE INDEX jobs_fair_backlog ON evora.jobs (queue, fairness_key, priority, run_at, submit_seq)
    WHERE state IN ('PENDING', 'WAITING') AND fairness_key IS NOT NULL;

-- Weights, per key or per prefix (`tenant:*`, its stem in a generated column, as
-- flow_limits has), set by PUT /v1/fairness/{key}. A key without a weight of its own takes
-- the longest prefix's, else 1.
CREATE TABLE evora.fairness_weights (
    key text PRIMARY KEY,
    weight float8 NOT NULL CONSTRAINT fairness_weights_weight CHECK (weight BETWEEN 0.001 AND 1000),
    stem text GENERATED ALWAYS AS (CASE WHEN key LIKE '%*' THEN left(key, -1) END) STORED,
    changed_at timestamptz NOT NULL
);
CREATE INDEX fairness_weights_prefixes ON evora.fairness_weights (stem) WHERE stem IS NOT NULL;

-- A queue under fair scheduling: made by the first keyed job submitted to it. Its row is the
-- lock that serialises the queue's fair claims (each holds it to its commit), and holds the
-- queue's virtual time.
CREATE TABLE evora.fair_queues (
    queue text PRIMARY KEY,
    vtime float8 NOT NULL DEFAULT 0
);

-- A key's virtual time in a queue. Changed only by a claim holding the queue's row lock.
-- `vfinish`: where the key's next job starts in virtual time (no earlier than the queue's);
-- `est`: the lease time a claim charges in advance (a moving average of what its attempts
-- held); `outstanding`/`running`: what claims charged for attempts not settled yet;
-- `backlogged`: the key has PENDING or WAITING jobs, as far as the claims know (the claim
-- walks only these keys); `served`, `held_seconds`: totals for the metrics and the audit.
CREATE TABLE evora.fair_keys (
    queue text NOT NULL,
    key text NOT NULL,
    vfinish float8 NOT NULL,
    est float8 NOT NULL DEFAULT 1,
    outstanding float8 NOT NULL DEFAULT 0,
    running integer NOT NULL DEFAULT 0,
    backlogged boolean NOT NULL DEFAULT true,
    served bigint NOT NULL DEFAULT 0,
    held_seconds float8 NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, key)
);
-- the claim's walk: the backlogged keys of a queue in virtual-finish order (then by key, so
-- that "the keys the walk read" is a range)
CREATE INDEX fair_keys_turn ON evora.fair_keys (queue, vfinish, key) WHERE backlogged;

-- What happened to keyed jobs since the queue's last fair claim, appended without a lock by
-- the paths that make a keyed job PENDING (submission, retry, release) and that end a keyed
-- attempt (`held`: the seconds its lease was held), and folded into fair_keys by the next
-- claim under the queue's lock (which deletes what it folds). An append, not an update, so
-- that submissions and acks never wait for a claim, nor a claim for them.
CREATE TABLE evora.fair_ledger (
    queue text NOT NULL,
    key text NOT NULL,
    -- attempts ended, and the seconds their leases were held (0 and 0: the key has new work)
    ended integer NOT NULL,
    held float8 NOT NULL
);
CREATE INDEX fair_ledger_queue ON evora.fair_ledger (queue);
