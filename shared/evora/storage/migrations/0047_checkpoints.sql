-- Evora schema, version 47: checkpoints (docs/jobs-that-wait.md, "Checkpoints"). A handler
-- records the result of a step it finished (`POST /v1/jobs/{id}/checkpoints`, fenced by its
-- lease); the job keeps them, name -> data, and hands them to its next attempt, which resumes
-- after the last step done instead of repeating it. NULL: none recorded. Bounded in count and
-- size by the statement that writes it (storage/sql/checkpoints.sql); read with the job,
-- never alone, so it is a column rather than a table. The previous release's services never
-- write it.
ALTER TABLE evora.jobs ADD COLUMN checkpoints jsonb;
