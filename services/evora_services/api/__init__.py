"""`evora api`: the producer and admin HTTP service (docs/http-api.md)."""
