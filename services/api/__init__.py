"""`evora api`: the producer and admin HTTP service (CONTRACT section 4)."""
