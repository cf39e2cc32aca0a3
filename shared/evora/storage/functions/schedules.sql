-- Schedules (docs/schedules.md): what the scheduler adds to the events of the jobs it
-- submits.
--
-- The current text of every function and trigger of this area: edit it here. `evora migrate`
-- runs this file again, whole, whenever its text changed (after the numbered migrations), so
-- every statement must be re-runnable: CREATE OR REPLACE. A change of signature, or a
-- function removed, also needs a numbered migration that drops the old one (CONTRIBUTING.md).

-- The `submitted` event of a job made by a schedule names the schedule and the tick. The
-- scheduler sets `evora.submitted_data` (a JSON object, transaction-local) before it
-- submits, so the submission itself stays the one every producer uses; the setting is
-- empty or absent everywhere else, and the WHEN clause keeps those inserts off PL/pgSQL.
CREATE OR REPLACE FUNCTION evora_add_submitted_data() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.data := NEW.data || current_setting('evora.submitted_data')::jsonb;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER job_events_submitted_data
    BEFORE INSERT ON job_events
    FOR EACH ROW
    WHEN (NEW.event = 'submitted' AND current_setting('evora.submitted_data', true) <> '')
    EXECUTE FUNCTION evora_add_submitted_data();
