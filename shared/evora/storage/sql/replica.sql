-- Positions in the write-ahead log that decide whether a read replica may answer a read
-- (evora.storage.replica, docs/scaling.md#read-replica). Both as LSN text.

-- name: primary_position
-- On the primary: past the end of every transaction committed before this statement. The
-- insert position, not pg_current_wal_lsn() (what has been written out): with
-- synchronous_commit off a commit returns before its record is written.
SELECT pg_current_wal_insert_lsn()::text;

-- name: replica_position
-- On a hot standby: how far it has replayed the primary's log (NULL on a server that is not
-- a standby), and how many seconds behind the primary it is. The lag is the age of the last
-- transaction replayed, except when everything received has been replayed: an idle primary
-- commits nothing, and the last transaction's age would grow without the standby being
-- behind at all (the receive position starts at the beginning of a segment, before the
-- replay position, hence <=). It is an upper bound: after an idle spell, the first commits
-- that wait to be replayed show the age of the last one before it. NULL when it cannot tell:
-- it receives nothing (the primary is unreachable), or replayed no transaction since it
-- started.
SELECT
    pg_last_wal_replay_lsn()::text AS replayed,
    CASE
        WHEN pg_last_wal_receive_lsn() <= pg_last_wal_replay_lsn() THEN 0.0
        ELSE extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8
    END AS lag;
