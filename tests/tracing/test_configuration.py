"""When the services trace (the OTEL_* environment), and that nothing of OpenTelemetry is
imported, by the services or the SDK, when nobody traces."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping

import pytest

from evora.tracing import requested_exporters
from evora.tracing.setup import provider_from_environment


@pytest.mark.parametrize(
    ("environ", "exporters"),
    [
        ({}, []),
        ({"OTEL_SERVICE_NAME": "x"}, []),
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "console, otlp"}, ["console", "otlp"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, []),
    ],
)
def test_exporters_the_environment_asks_for(
    environ: Mapping[str, str], exporters: list[str]
) -> None:
    assert requested_exporters(environ) == exporters


def test_an_unknown_exporter_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="zipkin"):
        requested_exporters({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_otlp_over_grpc_is_refused_rather_than_sent_over_http() -> None:
    with pytest.raises(ValueError, match="http/protobuf"):
        provider_from_environment("evora-api", ["otlp"], {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})


def test_the_service_is_named_unless_the_environment_names_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    provider = provider_from_environment("evora-api", ["console"], {})
    assert provider.resource.attributes["service.name"] == "evora-api"
    provider.shutdown()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "queue-api")
    provider = provider_from_environment("evora-api", ["console"], {})
    assert provider.resource.attributes["service.name"] == "queue-api"
    provider.shutdown()


UNTRACED = """
import asyncio, os, sys
from evora import tracing
from evora_services.api.app import create_app as api
from evora_services.dispatcher.app import create_app as dispatcher
from evora.config import Settings
import evora
from evora.sdk.tracing import context_headers

tracing.configure("api", os.environ)
settings = Settings(database_url="postgresql://nowhere/db", tokens="admin:" + "a" * 24)
async def main():
    await api(settings)
    await dispatcher(settings)
asyncio.run(main())
assert context_headers() is None
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
print(loaded)
"""


def test_nothing_of_opentelemetry_is_imported_when_nobody_traces() -> None:
    environ = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", UNTRACED], env=environ, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_command_line_refuses_an_exporter_it_cannot_honour_in_one_line() -> None:
    environ = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": ":".join(sys.path),
        "EVORA_DATABASE_URL": "postgresql://127.0.0.1:1/none",
        "OTEL_TRACES_EXPORTER": "zipkin",
    }
    done = subprocess.run(
        [sys.executable, "-m", "evora_services.cli", "migrate"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "evora: invalid configuration: OTEL_TRACES_EXPORTER names zipkin: supported are "
        "otlp, console and none"
    ]
