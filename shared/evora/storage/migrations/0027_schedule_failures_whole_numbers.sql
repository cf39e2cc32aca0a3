-- Evora schema, version 27: a schedule that cannot fire fails alone, on the record; an
-- integer field of a submission takes any JSON number whose value is whole.
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

-- An integer field (priority, max_attempts, lease_seconds) took only the digits of an
-- integer: jsonb reads 1e2 as 100, but keeps the scale of 100.0, which was refused, while
-- `POST /v1/jobs` refused both (its parser made floats of them). One rule for both now: any
-- number whose value is whole, however it is written (100, 1e2, 100.0, 1.0E2). Otherwise
-- as in version 11.
CREATE OR REPLACE FUNCTION evora.number_field(
    value jsonb, field text, lo numeric, hi numeric, integral boolean,
    above_lo boolean DEFAULT false
) RETURNS numeric
LANGUAGE plpgsql STABLE AS $$
DECLARE
    n numeric;
BEGIN
    IF jsonb_typeof(value) <> 'number' THEN
        PERFORM evora.reject(field, CASE WHEN integral THEN 'must be an integer'
                                         ELSE 'must be a number' END);
    END IF;
    n := value::text::numeric;
    IF integral AND n <> trunc(n) THEN
        PERFORM evora.reject(field, 'must be an integer');
    END IF;
    IF n > hi OR (CASE WHEN above_lo THEN n <= lo ELSE n < lo END) THEN
        PERFORM evora.reject(field, format('must be %s %s and at most %s',
            CASE WHEN above_lo THEN 'above' ELSE 'at least' END, lo, hi));
    END IF;
    RETURN n;
END
$$;
