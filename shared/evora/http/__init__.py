"""HTTP plumbing shared by every service: app factory, auth, problem+json, bodies, metrics,
OpenAPI."""
