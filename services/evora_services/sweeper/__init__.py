"""The sweeper: lease and TTL expiry, retention, and database health metrics (`evora
sweeper`, docs/architecture.md#services)."""
