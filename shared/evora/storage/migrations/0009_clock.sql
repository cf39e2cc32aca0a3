-- Evora schema, version 9: one clock for every time-dependent statement.
--
-- `evora_now()` is the database's own `now()` (the start of the transaction): PostgreSQL
-- stays the only clock, whatever the clocks of the machines running the services say. A
-- session may run it ahead by an interval in the `evora.clock_offset` setting, which only
-- tests set (per database, so every connection a test's services open sees the same time),
-- instead of rewriting deadlines behind the state machine's back. Unset, it adds nothing.
-- The function is plain SQL, STABLE and one expression, so the planner inlines it: a
-- statement evaluates `now() + offset` exactly as it evaluated `now()`, with no function call.

CREATE FUNCTION evora_now() RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT now() + coalesce(nullif(current_setting('evora.clock_offset', true), '')::interval,
                            interval '0')
$$;
