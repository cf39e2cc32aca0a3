"""Small example programs for the README."""
