-- Evora schema, version 8: a time-to-live (`expires_at`) applies to jobs never started.
--
-- A job that was claimed and now waits for its retry has started: its TTL no longer
-- dead-letters it. The sweeper looks for the next TTL to expire through this index, so it
-- holds only the jobs the TTL can still act on.

DROP INDEX IF EXISTS jobs_pending_ttl;

CREATE INDEX jobs_pending_ttl ON jobs (expires_at)
    WHERE state = 'PENDING' AND expires_at IS NOT NULL AND started_at IS NULL;
