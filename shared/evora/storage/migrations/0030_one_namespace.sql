-- Evora schema, version 30: every object of Evora's in one schema, `evora`, named one way
-- (issue 32). A user's database keeps its own schema (`public`) clean, and a reader finds
-- Evora's tables as `evora.jobs`, `evora.job_events`, ... (or with `search_path = evora`).
--
-- SET SCHEMA changes the catalog only: rows, indexes, constraints, triggers, the sequences a
-- table owns, grants and every object's oid stay (a trigger, a column default or a function's
-- argument names its function or type by oid), so this takes a moment whatever the tables
-- hold. Inside `evora` the `evora_` prefix of the internal functions and types says nothing:
-- they lose it (`evora_claim_jobs` is `evora.claim_jobs`), except `evora_now`, which becomes
-- `evora.clock_now` so that no name of Evora's is also one of pg_catalog's. The functions
-- applications call (`evora.submit`, `evora.submit_batch`) were in `evora` already and keep
-- their names and signatures. Every function file runs after this, in its transaction, and
-- replaces each moved function's body with its schema-qualified text.
--
-- The previous release's statements name the tables unqualified, so they fail from the
-- commit of this on: this upgrade is not rolling (docs/deploy.md, Upgrades).
--
-- Functions first, while the types their arguments name are still where the names find
-- them; then the types; then the tables, each with its indexes, triggers and sequences (one
-- already in `evora`, made there under a role named `evora` as said below, stays where it
-- is: SET SCHEMA into its own schema changes nothing). A function may be missing: on a database migrated for the first time, the function files
-- (which run after this) have not made yet the ones no migration did.
DO $$
DECLARE
    f   record;
    fn  regprocedure;
BEGIN
    FOR f IN SELECT * FROM (VALUES
        ('evora_add_submitted_data()', 'add_submitted_data'),
        ('evora_backoff_seconds(double precision, double precision, double precision, integer)', 'backoff_seconds'),
        ('evora_claim_jobs(uuid[], boolean[], text, timestamp with time zone)', 'claim_jobs'),
        ('evora_claim_limited(text[], text[], integer)', 'claim_limited'),
        ('evora_claim_limited(text[], text[], integer, text)', 'claim_limited'),
        ('evora_claimable(jobs, text, timestamp with time zone, text[])', 'claimable'),
        ('evora_dependent_next_state(jobs, integer, boolean)', 'dependent_next_state'),
        ('evora_drop_archived_events(bigint, double precision, integer)', 'drop_archived_events'),
        ('evora_end_attempts(evora_attempt_end[], text[])', 'end_attempts'),
        ('evora_governing_limits(text[])', 'governing_limits'),
        ('evora_hold_dependencies(uuid[])', 'hold_dependencies'),
        ('evora_job_image(jobs)', 'job_image'),
        ('evora_leave_dlq(uuid[], job_state, text[])', 'leave_dlq'),
        ('evora_note_ended_dependency()', 'note_ended_dependency'),
        ('evora_now()', 'clock_now'),
        ('evora_prune_finished(double precision, integer, job_state)', 'prune_finished'),
        ('evora_queue_paused(text)', 'queue_paused'),
        ('evora_record_limit_change()', 'record_limit_change'),
        ('evora_record_moves(evora_move[], text[])', 'record_moves'),
        ('evora_reject_event_change()', 'reject_event_change'),
        ('evora_reject_illegal_transition()', 'reject_illegal_transition'),
        ('evora_reject_live_delete()', 'reject_live_delete'),
        ('evora_reject_unarchived_delete()', 'reject_unarchived_delete'),
        ('evora_running_holding(text)', 'running_holding'),
        ('evora_settle_dependents()', 'settle_dependents'),
        ('evora_settlement(uuid[], job_state[])', 'settlement'),
        ('evora_tokens(flow_buckets, integer, double precision, timestamp with time zone)', 'tokens'),
        ('evora_waiting_dependents(uuid)', 'waiting_dependents')
    ) AS v(old, new) LOOP
        fn := to_regprocedure(f.old);
        IF fn IS NOT NULL THEN
            EXECUTE format('ALTER FUNCTION %s SET SCHEMA evora', fn);
            EXECUTE format('ALTER FUNCTION %s RENAME TO %I', fn, f.new);
            -- Where the role that migrates is named `evora` (the docker compose and
            -- Kubernetes defaults), `evora` came first in its search_path ("$user") from
            -- migration 0011 on: the function files made their functions there, beside the
            -- same ones in `public` that earlier migrations had made and nothing has called
            -- since. The one moved is the one the name found first (the one the triggers
            -- use); the other goes (if anything still used it, the drop would fail).
            fn := to_regprocedure(f.old);
            IF fn IS NOT NULL THEN
                EXECUTE format('DROP FUNCTION %s', fn);
            END IF;
        END IF;
    END LOOP;
END
$$;

ALTER TYPE job_state SET SCHEMA evora;
ALTER TYPE job_image SET SCHEMA evora;
ALTER TYPE evora_attempt_end SET SCHEMA evora;
ALTER TYPE evora.evora_attempt_end RENAME TO attempt_end;
ALTER TYPE evora_claim_candidate SET SCHEMA evora;
ALTER TYPE evora.evora_claim_candidate RENAME TO claim_candidate;
ALTER TYPE evora_move SET SCHEMA evora;
ALTER TYPE evora.evora_move RENAME TO move;

ALTER TABLE event_archive_runs SET SCHEMA evora;
ALTER TABLE event_archive_watermark SET SCHEMA evora;
ALTER TABLE flow_buckets SET SCHEMA evora;
ALTER TABLE flow_limit_changes SET SCHEMA evora;
ALTER TABLE flow_limits SET SCHEMA evora;
ALTER TABLE idempotency_keys SET SCHEMA evora;
ALTER TABLE job_dependencies SET SCHEMA evora;
ALTER TABLE job_events SET SCHEMA evora;
ALTER TABLE job_prune_counts SET SCHEMA evora;
ALTER TABLE job_traces SET SCHEMA evora;
ALTER TABLE job_transitions SET SCHEMA evora;
ALTER TABLE jobs SET SCHEMA evora;
ALTER TABLE paused_queues SET SCHEMA evora;
ALTER TABLE projector_progress SET SCHEMA evora;
ALTER TABLE schedules SET SCHEMA evora;

-- The records of the schema, where `evora migrate` made them before this migration; a
-- database migrated for the first time by a release that has it made them in `evora`
-- already (storage/migrate.py).
DO $$
BEGIN
    IF to_regclass('evora.migrations') IS NULL THEN
        ALTER TABLE evora_migrations SET SCHEMA evora;
        ALTER TABLE evora.evora_migrations RENAME TO migrations;
        ALTER INDEX evora.evora_migrations_pkey RENAME TO migrations_pkey;
    END IF;
    IF to_regclass('evora.function_files') IS NULL AND to_regclass('evora_function_files') IS NOT NULL THEN
        ALTER TABLE evora_function_files SET SCHEMA evora;
        ALTER TABLE evora.evora_function_files RENAME TO function_files;
        ALTER INDEX evora.evora_function_files_pkey RENAME TO function_files_pkey;
    END IF;
END
$$;

-- A role an operator granted one of these tables to (a reader of `jobs`) keeps its grant,
-- and needs the schema's USAGE to reach it: migration 0011 gave `evora`'s to nobody but
-- evora_producer. PUBLIC's grants, if any, are left without it on purpose (as 0011 did).
DO $$
DECLARE
    grantee regrole;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee::regrole
        FROM pg_class c, aclexplode(c.relacl) a
        WHERE c.relnamespace = 'evora'::regnamespace AND a.grantee <> 0
          AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT USAGE ON SCHEMA evora TO %s', grantee);
    END LOOP;
END
$$;
