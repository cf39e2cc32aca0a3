"""The admin dashboard (CONTRACT section 4, `GET /`): static files served by the api itself.

The page is plain HTML, CSS and JavaScript modules (no build step, nothing fetched from
elsewhere); it asks for an admin token and calls the api's own endpoints with it.
"""

from services.api.dashboard.routes import dashboard

__all__ = ["dashboard"]
