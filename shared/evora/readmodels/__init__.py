"""MongoDB read models: derived, rebuildable views of the outbox, written only by the
projector and read by the api."""
