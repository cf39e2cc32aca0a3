-- Evora schema, version 67: a job's backoff and on_dependency_failure are stored as NULL when
-- they are the defaults.
--
-- A claim and a completion are never HOT updates (the partial indexes' predicates name
-- `state`), so each writes the whole new row to the WAL, and so does the submission: every
-- byte of a row costs about three in a job's WAL. Nearly every job has the default backoff
-- (1 s, 3600 s, x2: 24 bytes) and on_dependency_failure 'cancel' (7 bytes); stored as NULL,
-- they cost a bit each in the row's null bitmap. Measured at store level (bench.drain_pg,
-- 2026-12-02): a row of 256 -> 224 bytes, WAL per submitted job -22 B, per drained job -92 B.
--
-- NULL means:
--   backoff_initial, backoff_max, backoff_multiplier: the default backoff, evora.limits()
--       -> 'backoff' (initial_seconds, max_seconds, multiplier), each field apart; read
--       through evora.backoff_seconds() (functions/claims_and_transitions.sql) in the
--       database and evora.storage.rows in Python, which holds the same numbers
--       (evora.protocol.jobs.Backoff; tests/sql_enqueue/test_bounds.py keeps them equal).
--       A release that changes the default writes the old one into the rows holding NULL
--       first, in the same migration.
--   on_dependency_failure: 'cancel' (every reader asks whether it is 'run').
-- Rows written before keep their values, which read the same; nothing is rewritten. Dropping
-- NOT NULL and a default changes only the catalog (a moment's ACCESS EXCLUSIVE lock).
-- The CHECK constraints hold for what is stored: NULL passes them, and both ways in
-- (`POST /v1/jobs` and evora.submit()) refuse a backoff whose max is below its initial
-- before anything is stored, a default field counted with its value.
ALTER TABLE evora.jobs
    ALTER COLUMN backoff_initial DROP NOT NULL,
    ALTER COLUMN backoff_max DROP NOT NULL,
    ALTER COLUMN backoff_multiplier DROP NOT NULL,
    ALTER COLUMN on_dependency_failure DROP NOT NULL,
    ALTER COLUMN on_dependency_failure DROP DEFAULT;

COMMENT ON COLUMN evora.jobs.backoff_initial IS
    'NULL: the default, evora.limits() -> backoff -> initial_seconds';
COMMENT ON COLUMN evora.jobs.backoff_max IS
    'NULL: the default, evora.limits() -> backoff -> max_seconds';
COMMENT ON COLUMN evora.jobs.backoff_multiplier IS
    'NULL: the default, evora.limits() -> backoff -> multiplier';
COMMENT ON COLUMN evora.jobs.on_dependency_failure IS 'NULL: cancel';
