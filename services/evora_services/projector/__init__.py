"""The projector: tails the job_events outbox into MongoDB read models."""
