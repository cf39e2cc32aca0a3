"""The job domain: states, transitions, models and errors shared by every service."""
