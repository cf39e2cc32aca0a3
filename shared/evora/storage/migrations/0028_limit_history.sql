-- Evora schema, version 28: the history of the limits, for the auditor (docs/audit.md).
--
-- `flow_limits` holds each limit as it is now; a claim obeys the limits as they were when it
-- began. To check claims against the limit in force (docs/flow-control.md: a limit applies
-- to every claim that begins after its change commits), every change of a limit (put,
-- replace, delete) is kept here, with the transaction's time (`now()`, the real clock, like
-- `flow_limits.updated_at`). A row trigger writes it, so whatever changes `flow_limits`
-- (the api, an operator's SQL) is recorded; limits change rarely, so it costs nothing on any
-- path that matters. The limits that exist when this migration runs are recorded as set at
-- their `updated_at`.

CREATE TABLE flow_limit_changes (
    seq              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key              text        NOT NULL,
    -- the limit from then on; all NULL (and `deleted`) when it was removed
    concurrency      integer,
    rate_limit       integer,
    rate_per_seconds float8,
    deleted          boolean     NOT NULL,
    changed_at       timestamptz NOT NULL DEFAULT now()
);

INSERT INTO flow_limit_changes (key, concurrency, rate_limit, rate_per_seconds, deleted,
                                changed_at)
SELECT key, concurrency, rate_limit, rate_per_seconds, false, updated_at
FROM flow_limits
ORDER BY updated_at, key;

CREATE FUNCTION evora_record_limit_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO flow_limit_changes (key, deleted) VALUES (OLD.key, true);
    ELSE
        INSERT INTO flow_limit_changes (key, concurrency, rate_limit, rate_per_seconds, deleted)
        VALUES (NEW.key, NEW.concurrency, NEW.rate_limit, NEW.rate_per_seconds, false);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER flow_limits_history
    AFTER INSERT OR UPDATE OR DELETE ON flow_limits
    FOR EACH ROW EXECUTE FUNCTION evora_record_limit_change();
