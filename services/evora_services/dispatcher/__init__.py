"""The dispatcher: worker-facing HTTP service with long-poll claims
(docs/http-api.md#worker-api)."""
