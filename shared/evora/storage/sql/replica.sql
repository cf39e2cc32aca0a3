-- Positions in the write-ahead log that decide whether a read replica may answer a read
-- (evora.storage.replica, docs/scaling.md#read-replica). Both as LSN text.

-- name: primary_position
-- On the primary: past the end of every transaction committed before this statement. The
-- insert position, not pg_current_wal_lsn() (what has been written out): with
-- synchronous_commit off a commit returns before its record is written.
SELECT pg_current_wal_insert_lsn()::text;

-- name: replica_position
-- On a hot standby: how far it has replayed the primary's log (NULL on a server that is not
-- a standby); whether it has replayed everything it received (the receive position starts
-- at the beginning of a segment, before the replay position, hence <=; false while it
-- receives nothing); and the age of the last transaction it replayed (NULL before it
-- replayed one), in seconds. evora.storage.replica makes its lag of the two.
SELECT
    pg_last_wal_replay_lsn()::text AS replayed,
    coalesce(pg_last_wal_receive_lsn() <= pg_last_wal_replay_lsn(), false) AS caught_up,
    extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8
        AS replay_age;
