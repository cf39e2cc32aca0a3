-- Guards: the triggers that make the database enforce the state machine, keep live jobs
-- from being deleted (docs/architecture.md, rule 2; the outbox's own: outbox.sql).
--
-- The current text of this area's functions and triggers: edit them here. `evora migrate`
-- runs the file again whole, so every statement is re-runnable (CONTRIBUTING.md says how).

-- The state machine is enforced by the database, whoever issues the SQL: the triggers below
-- reject a new job that is not PENDING or WAITING and any change of state that is not a legal
-- move. Their WHEN clauses decide in C; the function only runs to reject.
CREATE OR REPLACE FUNCTION evora.reject_illegal_transition() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        RAISE EXCEPTION 'a new job must be PENDING or WAITING, not %', NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    RAISE EXCEPTION 'illegal job transition % -> % (job %)', OLD.state, NEW.state, OLD.id
        USING ERRCODE = 'check_violation';
END
$$;

-- Once accepted, a job is never lost: only finished jobs may be deleted (pruned).
CREATE OR REPLACE FUNCTION evora.reject_live_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'job % is % and may not be deleted', OLD.id, OLD.state
        USING ERRCODE = 'check_violation';
END
$$;

-- The WHEN clauses keep the common path (legal inserts, updates that keep the state) in C: a
-- new job must be PENDING or WAITING (submitted with unfinished dependencies).
CREATE OR REPLACE TRIGGER jobs_new_state_guard
    BEFORE INSERT ON evora.jobs
    FOR EACH ROW WHEN (NEW.state NOT IN ('PENDING', 'WAITING'))
    EXECUTE FUNCTION evora.reject_illegal_transition();

-- The state machine, checked in the WHEN clause: evaluated in C and unable to hold a subquery,
-- it lists the legal moves, the rows of job_transitions (and TRANSITIONS in
-- evora/domain/states.py) with a from_state; tests/integration/test_state_machine.py checks
-- that the three agree, so a migration that changes job_transitions changes this list too.
-- The function runs only to reject. AFTER, not BEFORE: an illegal move fails its statement
-- either way, but a table with any BEFORE UPDATE row trigger has every UPDATE lock its row
-- first (to hand the trigger the newest version), a WAL record per row updated, for each
-- completion and heartbeat too (tests/integration/test_hot_path_indexes.py). The WHEN clause
-- of an AFTER row trigger is evaluated as each row is updated: a legal move queues nothing.
CREATE OR REPLACE TRIGGER jobs_transition_guard
    AFTER UPDATE OF state ON evora.jobs
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state AND (OLD.state, NEW.state) NOT IN (
        ('DLQ', 'CANCELLED'), ('DLQ', 'PENDING'),
        ('PENDING', 'CANCELLED'), ('PENDING', 'DLQ'), ('PENDING', 'RUNNING'),
        ('RUNNING', 'CANCELLED'), ('RUNNING', 'COMPLETED'), ('RUNNING', 'DLQ'),
        ('RUNNING', 'PENDING'), ('RUNNING', 'SUSPENDED'), ('RUNNING', 'WAITING'),
        ('SUSPENDED', 'CANCELLED'), ('SUSPENDED', 'DLQ'), ('SUSPENDED', 'PENDING'),
        ('WAITING', 'CANCELLED'), ('WAITING', 'PENDING')))
    EXECUTE FUNCTION evora.reject_illegal_transition();

-- Once accepted, a job is never lost: only finished jobs may be pruned (a WAITING or SUSPENDED
-- job is live).
CREATE OR REPLACE TRIGGER jobs_live_delete_guard
    BEFORE DELETE ON evora.jobs
    FOR EACH ROW WHEN (OLD.state IN ('PENDING', 'RUNNING', 'WAITING', 'SUSPENDED'))
    EXECUTE FUNCTION evora.reject_live_delete();
