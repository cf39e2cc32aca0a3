-- Evora schema, version 50: fairness keys honoured in queues that also have limits
-- (docs/flow-control.md, "Fairness and limits"). The limited claim takes a fair queue's keyed
-- jobs in the fair order (evora.fair_pick(), functions/fairness.sql) and enforces the limits
-- on them; a candidate carries its place in that order, so the limits' room goes to the
-- smallest start tags first. NULL for the candidates of the limited claim's own windows
-- (unkeyed jobs, queues without fairness keys), which keep their order after the fair ones.
ALTER TYPE evora.claim_candidate ADD ATTRIBUTE fair_rank integer;
