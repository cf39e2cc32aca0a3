"""The operator's commands, `evora jobs`, `evora queues`, `evora dlq`, `evora schedules` and
`evora limits`: the api driven through the SDK's `evora.Client`, so they run with the SDK
alone (`evora-queue` without extras, no server dependency; import-linter holds this package
to the SDK and the protocol)."""
