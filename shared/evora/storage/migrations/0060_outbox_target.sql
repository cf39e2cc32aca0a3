-- Evora schema, version 60: where the outbox reader writes each new span target it hands
-- out (docs/architecture.md, "The outbox"). The write is what matters, not the row: its
-- commit waits for the log to reach the disk, and so puts on disk every commit the target
-- counts finished. A transaction that wrote nothing but a NOTIFY commits without waiting
-- for the disk; a target stored outside PostgreSQL (the projector's checkpoint) that
-- counted it finished could outlive a crash losing its commit, and recovery could hand the
-- same xid to a transaction whose events that target would never read. One row, kept for
-- the operator: the newest target and when it was taken.
CREATE TABLE IF NOT EXISTS evora.outbox_target (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    target pg_snapshot NOT NULL,
    taken_at timestamptz NOT NULL
);
