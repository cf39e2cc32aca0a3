-- Evora schema, version 48: children awaited without holding a slot (docs/jobs-that-wait.md,
-- "Children"). A running job submits its children and waits for them
-- (`POST /v1/jobs/{id}/children`, evora.await_children() in functions/dependencies.sql): it
-- leaves RUNNING (and its worker) for WAITING with the children as its dependencies, holding
-- no lease, no limit slot and no FIFO group turn, its attempt handed back uncounted; the
-- dependency settlement makes it PENDING (or CANCELLED) when they end, as for any WAITING job.
INSERT INTO evora.job_transitions (from_state, to_state, event) VALUES
    ('RUNNING', 'WAITING', 'awaiting_children'),
    -- every child named had already ended (a replayed idempotency key): nothing to wait for,
    -- the job is PENDING again at once, its attempt handed back as above
    ('RUNNING', 'PENDING', 'awaiting_children');
