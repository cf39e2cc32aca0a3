"""The sweeper: lease and TTL expiry, retention, and database health metrics (CONTRACT
section 1, `evora sweeper`)."""
