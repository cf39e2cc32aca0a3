-- Evora schema, version 56: evora.submission_keys is pruned (docs/flow-control.md, "Debounce
-- and throttle"). It kept one row per (queue, kind, key) ever used, so a producer naming a
-- new key per request (a user id, a document id) grew it without bound. The sweeper now
-- removes, in batches (evora.prune_submission_keys(), functions/retention.sql):
--   * a throttle key whose window has passed: `until`, the end of the window of the
--     submission that made the key's job, is stored with the row to find them;
--   * a debounce key whose job is no longer PENDING and never started, or is gone: no later
--     submission can be absorbed by it, the next one makes a new job whether the row is
--     there or not.
ALTER TABLE evora.submission_keys ADD COLUMN until timestamptz;

-- Rows written before this migration do not know their window; they are kept a day (as
-- long as a window most producers use), then pruned like the others.
UPDATE evora.submission_keys SET until = since + interval '1 day' WHERE kind = 'throttle';

ALTER TABLE evora.submission_keys
    ADD CONSTRAINT submission_keys_until CHECK ((kind = 'throttle') = (until IS NOT NULL));

-- What each prune reads, oldest first, a batch at a time: throttle keys by the end of their
-- window (only the expired ones are read), debounce keys by when their job was made (a
-- debounce job is claimed in about that order, so the rows with a finished job come first).
-- A submission that makes a job writes one entry in one of them; one that is absorbed or
-- throttled writes none.
CREATE INDEX submission_keys_throttle_until ON evora.submission_keys (until)
    WHERE kind = 'throttle';
CREATE INDEX submission_keys_debounce_since ON evora.submission_keys (since)
    WHERE kind = 'debounce';
