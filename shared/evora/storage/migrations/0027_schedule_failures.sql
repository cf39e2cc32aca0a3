-- Evora schema, version 27: a schedule that cannot fire fails alone, on the record.
--
-- A step that could not make its tick's job (the stored submission is refused, or the
-- schedule can no longer be read) used to roll back and leave the schedule due, so the
-- scheduler took it first again and again and the schedules behind it made nothing. Now
-- the step records the error here and moves the schedule on to its next tick in the same
-- commit; a step that makes a job ends the streak. The last error stays after that,
-- so an operator can still read what went wrong.
ALTER TABLE schedules
    -- {"message": text, "type": text}, as a job's last_error; NULL: never failed
    ADD COLUMN last_error jsonb,
    ADD COLUMN last_error_at timestamptz,
    -- the first failure of the current streak (NULL: the last step succeeded)
    ADD COLUMN failing_since timestamptz,
    ADD COLUMN consecutive_failures integer NOT NULL DEFAULT 0;
