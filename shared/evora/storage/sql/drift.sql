-- What `evora migrate --check` (evora/storage/drift.py) reads: Evora's objects in the
-- catalog, one line each, compared with objects.txt (what a fresh `evora migrate` builds).

-- name: schema_objects
-- Tables and their columns, indexes, constraints, triggers, functions and types of the schema
-- `evora`, named as its readers write them (`evora.jobs`) and without what varies between
-- servers (oids, the order of creation). Run with an empty search_path (drift.py), so that
-- every name of Evora's in a definition is qualified whatever the session's search_path.
-- Members of extensions are someone else's; job_events' partitions (and their indexes), named
-- by the dates they hold, are data: the parent says what each has. Function bodies are left out:
-- evora.function_files' checksums say whether they are the code's.
WITH ours AS (
    SELECT oid, nspname || '.' AS prefix FROM pg_namespace WHERE nspname = 'evora'
), relations AS (
    SELECT c.oid, c.relname, c.relkind, o.prefix || c.relname AS name
    FROM pg_class c JOIN ours o ON o.oid = c.relnamespace
    WHERE NOT c.relispartition
      AND NOT EXISTS (SELECT FROM pg_depend d
                      WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                        AND d.deptype = 'e')
)
SELECT 'table ' || name AS object FROM relations WHERE relkind IN ('r', 'p', 'v', 'm')
UNION ALL
SELECT 'sequence ' || name FROM relations WHERE relkind = 'S'
UNION ALL
SELECT 'column ' || r.name || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
FROM relations r JOIN pg_attribute a ON a.attrelid = r.oid
WHERE r.relkind IN ('r', 'p', 'v', 'm') AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'index ' || i.name || ' on ' || t.name || ': '
       || regexp_replace(pg_get_indexdef(x.indexrelid), '^.* USING ', 'USING ')
FROM pg_index x JOIN relations i ON i.oid = x.indexrelid JOIN relations t ON t.oid = x.indrelid
UNION ALL
SELECT 'constraint ' || r.name || '.' || c.conname || ': ' || pg_get_constraintdef(c.oid)
FROM pg_constraint c JOIN relations r ON r.oid = c.conrelid
WHERE c.contype <> 'n'  -- NOT NULL, a constraint of its own from PostgreSQL 18: in the column
UNION ALL
SELECT 'trigger ' || r.name || '.' || t.tgname
FROM pg_trigger t JOIN relations r ON r.oid = t.tgrelid
WHERE NOT t.tgisinternal
UNION ALL
SELECT 'function ' || o.prefix || p.proname || '(' || pg_get_function_identity_arguments(p.oid)
       || ')'
FROM pg_proc p JOIN ours o ON o.oid = p.pronamespace
WHERE NOT EXISTS (SELECT FROM pg_depend d
                  WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                    AND d.deptype = 'e')
UNION ALL
SELECT 'type ' || o.prefix || t.typname
FROM pg_type t JOIN ours o ON o.oid = t.typnamespace
WHERE t.typtype IN ('e', 'd')
   OR (t.typtype = 'c' AND (SELECT relkind FROM pg_class WHERE oid = t.typrelid) = 'c');
