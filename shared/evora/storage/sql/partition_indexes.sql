-- What `evora migrate` does after a migration made an index ON ONLY a partitioned table, or
-- left one of a plain table to it (storage/migrate.py, build_partition_indexes): the
-- partitions that lack it get it built CONCURRENTLY, one at a time, and attached; a plain
-- table's is built CONCURRENTLY; the indexes it replaced go once it is valid.

-- name: partition_indexes_missing
-- Each partition of a table of schema `evora` that lacks an index of one of the table's
-- partitioned indexes: the partition's index to build, named after the partition and the
-- index as the migrations name those they build at once; the statement that builds it (the
-- partitioned index's own definition with CONCURRENTLY, and the partition in place of the
-- table), the one that attaches it, and the one that drops what an interrupted build left. A
-- partition being detached is left alone.
SELECT format('%I.%I', n.nspname, m.child) AS child, c.oid::regclass::text AS partition,
       regexp_replace(pg_get_indexdef(pi.indexrelid),
                      '^CREATE (UNIQUE )?INDEX \S+ ON (ONLY )?\S+ ',
                      format('CREATE \1INDEX CONCURRENTLY %I ON %s ', m.child, c.oid::regclass))
           AS build,
       format('ALTER INDEX %s ATTACH PARTITION %I.%I', pi.indexrelid::regclass, n.nspname,
              m.child) AS attach,
       format('DROP INDEX CONCURRENTLY IF EXISTS %I.%I', n.nspname, m.child) AS drop_leftover
FROM pg_index pi
JOIN pg_class ic ON ic.oid = pi.indexrelid AND ic.relkind = 'I'
JOIN pg_class pt ON pt.oid = pi.indrelid
JOIN pg_namespace n ON n.oid = ic.relnamespace AND n.nspname = 'evora'
JOIN pg_inherits t ON t.inhparent = pi.indrelid AND NOT t.inhdetachpending
JOIN pg_class c ON c.oid = t.inhrelid
CROSS JOIN LATERAL (
    SELECT left(c.relname, 30)
           || CASE WHEN starts_with(ic.relname, pt.relname || '_')
                   THEN substr(ic.relname, length(pt.relname) + 1)
                   ELSE '_' || ic.relname END AS child
) m
WHERE NOT EXISTS (
    SELECT FROM pg_inherits ii JOIN pg_index x ON x.indexrelid = ii.inhrelid
    WHERE ii.inhparent = pi.indexrelid AND x.indrelid = c.oid
)
ORDER BY pi.indexrelid, c.relname;

-- name: index_builds
-- The indexes of plain tables a migration left to build (evora.index_builds): each one's
-- name and qualified name, the statement that builds it CONCURRENTLY and the one that drops
-- what an interrupted build left.
SELECT b.name, format('evora.%I', b.name) AS child,
       regexp_replace(b.build, '^CREATE (UNIQUE )?INDEX ', 'CREATE \1INDEX CONCURRENTLY ')
           AS build,
       format('DROP INDEX CONCURRENTLY IF EXISTS evora.%I', b.name) AS drop_leftover
FROM evora.index_builds b
ORDER BY b.name;

-- name: forget_index_build
-- $1 a name of evora.index_builds, built.
DELETE FROM evora.index_builds WHERE name = $1;

-- name: index_state
-- $1 an index's qualified name: whether it exists, and whether it is valid (an interrupted
-- CREATE INDEX CONCURRENTLY leaves an invalid one behind).
SELECT x.indisvalid AS valid
FROM pg_index x
WHERE x.indexrelid = to_regclass($1);

-- name: partition_attached
-- $1 a table's qualified name: whether it is a partition still (not detached, nor being).
SELECT EXISTS (
    SELECT FROM pg_inherits h WHERE h.inhrelid = to_regclass($1) AND NOT h.inhdetachpending
);

-- name: retiring_indexes_ready
-- The indexes a migration replaced whose replacement is now valid (evora.retiring_indexes):
-- the statement that drops each, NULL for one already gone (its row is removed all the same).
SELECT r.name,
       CASE WHEN to_regclass(format('evora.%I', r.name)) IS NOT NULL
            THEN format('DROP INDEX evora.%I', r.name) END AS drop
FROM evora.retiring_indexes r
JOIN pg_index x ON x.indexrelid = to_regclass(format('evora.%I', r.replaced_by))
WHERE x.indisvalid
ORDER BY r.name;

-- name: retiring_indexes
-- Every index a migration replaced that `evora migrate` has not dropped yet.
SELECT name FROM evora.retiring_indexes ORDER BY name;

-- name: forget_retiring_index
-- $1 a name of evora.retiring_indexes, dropped.
DELETE FROM evora.retiring_indexes WHERE name = $1;
