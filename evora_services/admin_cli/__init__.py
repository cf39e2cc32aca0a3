"""The operator's commands, `evora jobs`, `evora queues` and `evora dlq`: the api driven
through the SDK's `evora.Client`, so they run with a plain `pip install evora-queue` (no server
dependency; import-linter holds this package to the SDK and the protocol)."""
