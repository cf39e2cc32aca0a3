-- Schedules (docs/schedules.md): what the scheduler adds to the events of the jobs it
-- submits.
--
-- The current text of this area's functions and triggers: edit them here. `evora migrate`
-- runs the file again whole, so every statement is re-runnable (CONTRIBUTING.md says how).

-- The `submitted` event of a job made by a schedule names the schedule and the tick. The
-- scheduler sets `evora.submitted_data` (a JSON object, transaction-local) before it
-- submits, so the submission itself stays the one every producer uses; the setting is
-- empty or absent everywhere else, and the WHEN clause keeps those inserts off PL/pgSQL.
CREATE OR REPLACE FUNCTION evora.add_submitted_data() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.data := NEW.data || current_setting('evora.submitted_data')::jsonb;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER job_events_submitted_data
    BEFORE INSERT ON evora.job_events
    FOR EACH ROW
    WHEN (NEW.event = 'submitted' AND current_setting('evora.submitted_data', true) <> '')
    EXECUTE FUNCTION evora.add_submitted_data();
