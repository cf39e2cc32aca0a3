"""docs/http-api.md lists exactly the endpoints the services declare in /openapi.json, each
with exactly the statuses declared there, and every problem code the domain defines.

The OpenAPI documents are built in-process from the apps' declarations (the same ones that
route requests); nothing here needs a database.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from evora.config import Settings
from evora.domain.errors import EvoraError
from evora.http.openapi import openapi_document
from evora.protocol import problems
from evora_services.api.app import create_app as create_api
from evora_services.dispatcher.app import create_app as create_dispatcher
from evora_services.projector.app import create_app as create_projector
from evora_services.sweeper.app import create_app as create_sweeper

DOC = Path(__file__).resolve().parents[2] / "docs" / "http-api.md"

# The apps only connect when they start, which these tests never do.
SETTINGS = Settings(
    database_url="postgresql://nobody@127.0.0.1:1/none",
    mongo_url="mongodb://127.0.0.1:1",
    tokens="admin:unused-admin-token",
)

# Which services' endpoints each part (`## ...`) of the page describes.
SECTIONS = {
    "Every service": {"api", "dispatcher", "sweeper", "projector"},
    "Producer and admin API": {"api"},
    "Queues and workers": {"api"},
    "Dashboard": {"api"},
    "Worker API": {"dispatcher"},
}

Endpoint = tuple[str, str]  # (METHOD, path)

_ENDPOINT_HEADING = re.compile(r"^### `(GET|POST|PUT|PATCH|DELETE) (/\S*)`$")
_STATUS_ROW = re.compile(r"^\| (\d{3}) \|")


class Documented:
    """What the page says: endpoints by part, and the statuses listed under each."""

    def __init__(self, text: str) -> None:
        self.by_section: dict[str, set[Endpoint]] = defaultdict(set)
        self.statuses: dict[Endpoint, set[int]] = {}
        self.section_of: dict[Endpoint, str] = {}
        section = ""
        current: Endpoint | None = None
        for line in text.splitlines():
            if line.startswith("## "):
                section, current = line[3:].strip(), None
            elif line.startswith("### "):
                match = _ENDPOINT_HEADING.match(line)
                current = (match[1], match[2]) if match else None
                if current is not None:
                    assert current not in self.statuses, f"{current} is documented twice"
                    self.by_section[section].add(current)
                    self.section_of[current] = section
                    self.statuses[current] = set()
            elif current is not None and (row := _STATUS_ROW.match(line)):
                self.statuses[current].add(int(row[1]))

    def for_service(self, service: str) -> set[Endpoint]:
        return {
            endpoint
            for section, endpoints in self.by_section.items()
            if service in SECTIONS.get(section, set())
            for endpoint in endpoints
        }


@pytest.fixture(scope="module")
def documented() -> Documented:
    return Documented(DOC.read_text("utf-8"))


@pytest.fixture(scope="module")
async def openapi() -> dict[str, dict[str, Any]]:
    factories = {
        "api": create_api,
        "dispatcher": create_dispatcher,
        "sweeper": create_sweeper,
        "projector": create_projector,
    }
    return {name: openapi_document(await make(SETTINGS), name) for name, make in factories.items()}


def declared(document: dict[str, Any]) -> dict[Endpoint, set[int]]:
    return {
        (method.upper(), path): {int(status) for status in operation["responses"]}
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
    }


def test_every_part_of_the_page_is_known(documented: Documented) -> None:
    assert set(documented.by_section) <= set(SECTIONS), "a new `##` part needs a SECTIONS entry"


@pytest.mark.parametrize("service", ["api", "dispatcher", "sweeper", "projector"])
def test_the_page_lists_exactly_the_declared_endpoints(
    service: str, documented: Documented, openapi: dict[str, dict[str, Any]]
) -> None:
    served = set(declared(openapi[service]))
    listed = documented.for_service(service)
    assert served - listed == set(), f"{service} serves these, docs/http-api.md lacks them"
    assert listed - served == set(), f"docs/http-api.md lists these, {service} does not serve them"


def test_each_endpoint_lists_exactly_its_declared_statuses(
    documented: Documented, openapi: dict[str, dict[str, Any]]
) -> None:
    for endpoint, statuses in documented.statuses.items():
        for service in SECTIONS[documented.section_of[endpoint]]:
            assert statuses == declared(openapi[service])[endpoint], (service, endpoint)


def _subclasses(cls: type[EvoraError]) -> list[type[EvoraError]]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def _errors_table() -> set[tuple[int, str]]:
    """(status, code) of each row of the page's table of problem codes."""
    table = DOC.read_text("utf-8").split("### Errors", 1)[1].split("\n### ", 1)[0]
    return {(int(m[1]), m[2]) for m in re.finditer(r"^\| (\d{3}) \| `(\w+)` \|", table, re.M)}


def test_every_domain_error_is_in_the_errors_table_with_its_status() -> None:
    errors = _subclasses(EvoraError)
    assert errors, "no domain errors found"
    rows = _errors_table()
    for error in errors:
        assert (error.status, error.code) in rows, error.__name__


def test_every_protocol_problem_code_is_in_the_errors_table() -> None:
    codes = {value for name, value in vars(problems).items() if name.isupper()}
    assert "lease_lost" in codes
    assert codes - {code for _, code in _errors_table()} == set()
