"""The admin dashboard (`GET /`, docs/http-api.md#dashboard): static files served by the api itself.

The page is plain HTML, CSS and JavaScript modules (no build step, nothing fetched from
elsewhere); it asks for an admin token and calls the api's own endpoints with it.
"""

from evora_services.api.dashboard.routes import dashboard

__all__ = ["dashboard"]
