-- Evora schema, version 34: the role evora_worker, for a worker that completes or fails its
-- jobs in SQL inside its own transaction (evora.complete() and evora.fail(),
-- functions/claims_and_transitions.sql, which grants it EXECUTE on those two and nothing
-- else: the functions run as their owner). docs/sql-enqueue.md, "Finishing a job in SQL".

-- Roles belong to the cluster, not the database: another Evora database may have made it.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'evora_worker') THEN
        CREATE ROLE evora_worker NOLOGIN;
    END IF;
END
$$;

GRANT USAGE ON SCHEMA evora TO evora_worker;
