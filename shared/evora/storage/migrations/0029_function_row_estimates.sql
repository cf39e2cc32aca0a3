-- Evora schema, version 29: the set-returning functions the transitions call say how many
-- rows they return, so the statements that join them are planned at what their items cost.
--
-- Without a ROWS clause the planner takes a PL/pgSQL set-returning function for 1,000 rows.
-- The ack (`complete` in storage/sql/transitions.sql) joins each of its items to the one row
-- of evora_record_moves(): for 100 items the planner expected 100,000 rows, and the estimated
-- cost (86,000 with an empty table, past 200,000 a few hundred jobs later) crossed
-- jit_above_cost (100,000). A PostgreSQL built with JIT (most distributions' and managed
-- services') then compiled the statement with LLVM on every run: on Debian's 15, ~55 ms of
-- compiling for a statement that runs in ~5 (issue 34). An application's own session, which
-- calls these through evora.submit() or its own SQL, keeps its JIT settings whatever Evora's
-- connections set (storage/db.py), so the estimates themselves must be right.
--
-- Only the functions' planner estimate changes, so ALTER FUNCTION rather than a copy of each
-- body. A later CREATE OR REPLACE of one of them resets its estimate to 1,000 unless it
-- repeats the ROWS clause (tests/integration/test_plan_estimates.py notices).

-- One row, whatever it is given (the queues notified and owed).
ALTER FUNCTION evora_record_moves(evora_move[], text[]) ROWS 1;
-- One row per job moved, out of those given: a batch of acks, a sweep, a redrive; 100 stands
-- for a batch, as the planner's default does for an array's elements.
ALTER FUNCTION evora_end_attempts(evora_attempt_end[], text[]) ROWS 100;
ALTER FUNCTION evora_leave_dlq(uuid[], job_state, text[]) ROWS 100;
