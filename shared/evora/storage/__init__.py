"""PostgreSQL storage: migrations, the job store, the outbox reader and NOTIFY hints."""
