-- Evora schema, version 6: the state machine is checked in the trigger's WHEN clause.
--
-- The guard of version 1 ran a PL/pgSQL function (and a lookup in job_transitions) for
-- every state change, i.e. twice per job on the hot path. A WHEN clause is evaluated in C
-- and cannot hold a subquery, so the legal pairs are written into it here, generated from
-- job_transitions so that table stays the one statement of the state machine; the function
-- now only runs to reject. A migration that changes job_transitions must run this again.

DO $$
DECLARE
    legal text;
BEGIN
    SELECT string_agg(DISTINCT format('(%L::job_state, %L::job_state)', from_state, to_state),
                      ', ')
    INTO legal
    FROM job_transitions
    WHERE from_state IS NOT NULL;

    DROP TRIGGER IF EXISTS jobs_transition_guard ON jobs;
    EXECUTE format(
        'CREATE TRIGGER jobs_transition_guard '
        'BEFORE UPDATE OF state ON jobs FOR EACH ROW '
        'WHEN (OLD.state IS DISTINCT FROM NEW.state AND (OLD.state, NEW.state) NOT IN (%s)) '
        'EXECUTE FUNCTION evora_reject_illegal_transition()',
        legal);
END
$$;
