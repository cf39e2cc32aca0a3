-- Evora schema, version 31: the projector reads the outbox in spans between two snapshots
-- (PgQ's way, docs/architecture.md "the outbox"), no longer only below pg_snapshot_xmin, so
-- a transaction left open anywhere in the cluster no longer freezes the read models.
--
-- projector_progress records the snapshot every span a generation consumed ended at: every
-- event visible in it is in that generation's read models. `xid` stays what retention and
-- the archive go by, now that snapshot's xmin (every event below it is visible in it, so
-- consumed). A row recorded before spans, xid X, meant "every event with an xid below X":
-- the snapshot "X:X:" says exactly that. `seq` is what the previous release's projector
-- writes while it is rolled; nothing reads it, and it goes a release later.
ALTER TABLE evora.projector_progress ADD COLUMN snapshot pg_snapshot;
UPDATE evora.projector_progress SET snapshot = (xid::text || ':' || xid::text || ':')::pg_snapshot
WHERE xid::text::int8 > 0;
ALTER TABLE evora.projector_progress ALTER COLUMN seq SET DEFAULT 0;
