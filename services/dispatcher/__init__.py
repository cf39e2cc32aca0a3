"""The dispatcher: worker-facing HTTP service with long-poll claims (CONTRACT section 5)."""
