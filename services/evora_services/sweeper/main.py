"""`evora sweeper`."""

from __future__ import annotations

from evora.config import Settings
from evora.http.serve import run_service
from evora_services.sweeper.app import create_app


def run(settings: Settings) -> int:
    settings.require("database_url")
    return run_service(
        lambda: create_app(settings),
        name="sweeper",
        host=settings.bind_host,
        port=settings.sweeper_port,
    )
