"""The generated /openapi.json documents are as strict as the handlers: typed path and
query parameters, cross-field rules, and every status an endpoint answers with declared.

The documents are built from the apps' declarations; nothing here needs a database."""

from __future__ import annotations

import uuid
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openapi_spec_validator import validate

from evora.config import Settings
from evora.http.openapi import openapi_document
from evora.http.problems import PROBLEM_CONTENT_TYPE
from evora.protocol.bounds import QUEUE_PATTERN
from evora_services.api.app import create_app as create_api
from evora_services.api.models import (
    JobListQuery,
    PageQuery,
    decode_cursor,
    decode_job_cursor,
    encode_cursor,
)
from evora_services.dispatcher.app import create_app as create_dispatcher

UNUSED_DSN = "postgresql://nobody@127.0.0.1:1/none"  # the apps only connect on startup

SETTINGS = Settings(database_url=UNUSED_DSN, tokens="admin:unused-admin-token")

Document = dict[str, Any]

CURSOR_PATTERN = PageQuery.model_json_schema()["properties"]["after"]["anyOf"][0]["pattern"]
JOB_CURSOR_PATTERN = JobListQuery.model_json_schema()["properties"]["after"]["anyOf"][0]["pattern"]


@pytest.fixture(scope="module")
async def api() -> Document:
    return openapi_document(await create_api(SETTINGS), "api")


@pytest.fixture(scope="module")
async def dispatcher() -> Document:
    app = await create_dispatcher(SETTINGS)
    return openapi_document(app, "dispatcher")


def parameters(document: Document, method: str, path: str) -> dict[str, Document]:
    operation = document["paths"][path][method]
    return {p["name"]: p for p in operation.get("parameters", [])}


def body_validator(document: Document, model: str) -> jsonschema.Draft202012Validator:
    """A validator of `model` that resolves the document's references."""
    schema = {**document["components"]["schemas"][model], "components": document["components"]}
    return jsonschema.Draft202012Validator(schema)


def test_both_documents_are_valid_openapi(api: Document, dispatcher: Document) -> None:
    validate(api)
    validate(dispatcher)


def test_job_ids_are_uuids(api: Document, dispatcher: Document) -> None:
    for document in (api, dispatcher):
        for path, operations in document["paths"].items():
            for method in operations:
                if "{id}" in path:
                    schema = parameters(document, method, path)["id"]["schema"]
                    assert schema == {"type": "string", "format": "uuid"}, (method, path)


def test_queue_path_parameters_have_the_queue_pattern(api: Document) -> None:
    paths = [p for p in api["paths"] if "{queue}" in p]
    assert len(paths) == 7
    for path in paths:
        for method in api["paths"][path]:
            schema = parameters(api, method, path)["queue"]["schema"]
            assert schema == {"type": "string", "pattern": QUEUE_PATTERN}


def test_list_query_parameters_are_typed_and_never_null(api: Document) -> None:
    listed = parameters(api, "get", "/v1/jobs")
    assert listed["limit"]["schema"] == {
        "type": "integer",
        "minimum": 1,
        "maximum": 500,
        "default": 50,
        "title": "Limit",
    }
    assert listed["queue"]["schema"]["pattern"] == QUEUE_PATTERN
    assert listed["state"]["schema"] == {"$ref": "#/components/schemas/JobState"}
    cursor = listed["after"]["schema"]
    # a job's id, or (a cursor of the release before migration 0068) a submit_seq
    assert jsonschema.Draft202012Validator(cursor).is_valid(encode_cursor(uuid.uuid4()))
    assert jsonschema.Draft202012Validator(cursor).is_valid(encode_cursor(12345))
    assert not jsonschema.Draft202012Validator(cursor).is_valid("not a cursor")
    # 11 characters carry 66 bits; a cursor's last two are zero, so this one is not a cursor
    assert not jsonschema.Draft202012Validator(cursor).is_valid("IkUH99k_ycS")
    # 22 carry 132; an id's cursor's last four are zero
    assert not jsonschema.Draft202012Validator(cursor).is_valid("000000000000000000000B")
    for parameter in listed.values():
        assert "null" not in str(parameter["schema"])


def test_run_at_and_delay_seconds_exclude_each_other(api: Document) -> None:
    submission = body_validator(api, "JobSubmission")
    job = {"queue": "q", "type": "t"}
    assert submission.is_valid({**job, "run_at": "2030-01-01T00:00:00Z"})
    assert submission.is_valid({**job, "delay_seconds": 5})
    assert submission.is_valid({**job, "run_at": None, "delay_seconds": 5})
    assert not submission.is_valid({**job, "run_at": "2030-01-01T00:00:00Z", "delay_seconds": 5})


def test_backoff_order_is_described(api: Document) -> None:
    backoff = api["components"]["schemas"]["Backoff"]
    assert "max_seconds must be >= initial_seconds" in backoff["description"]


def test_a_fail_ack_needs_an_error(dispatcher: Document) -> None:
    ack = body_validator(dispatcher, "Ack")
    ids = {
        "id": "00000000-0000-4000-8000-000000000001",
        "lease_token": "00000000-0000-4000-8000-000000000002",
    }
    assert ack.is_valid({**ids, "outcome": "complete"})
    assert ack.is_valid({**ids, "outcome": "fail", "error": {"message": "boom"}})
    assert not ack.is_valid({**ids, "outcome": "fail"})
    assert not ack.is_valid({**ids, "outcome": "fail", "error": None})


def test_database_endpoints_declare_503(api: Document, dispatcher: Document) -> None:
    for document in (api, dispatcher):
        for path, operations in document["paths"].items():
            for method, operation in operations.items():
                if "security" in operation:  # every authenticated endpoint reads PostgreSQL
                    assert "503" in operation["responses"], (method, path)


def test_problem_answers_name_their_status(api: Document, dispatcher: Document) -> None:
    for document in (api, dispatcher):
        for operations in document["paths"].values():
            for operation in operations.values():
                for status, response in operation["responses"].items():
                    content = response.get("content", {})
                    if PROBLEM_CONTENT_TYPE in content:
                        schema = content[PROBLEM_CONTENT_TYPE]["schema"]
                        assert schema["properties"]["status"] == {"const": int(status)}


def test_dashboard_declares_revalidation_and_its_file_types(api: Document) -> None:
    asset = api["paths"]["/dashboard/{file}"]["get"]["responses"]
    assert "304" in asset
    assert "content" not in asset["304"]
    types = {t.split(";")[0] for t in asset["200"]["content"]}
    assert types == {"text/javascript", "text/css", "image/svg+xml"}


@given(st.data())
@settings(max_examples=200, deadline=None)
def test_every_cursor_the_pattern_allows_is_accepted(data: st.DataObject) -> None:
    # the document's `after` is exact: what matches the pattern is a cursor, not a 422
    cursor = data.draw(st.from_regex(CURSOR_PATTERN, fullmatch=True))
    submit_seq = decode_cursor(cursor)
    assert isinstance(submit_seq, int)
    assert encode_cursor(submit_seq) == cursor
    cursor = data.draw(st.from_regex(JOB_CURSOR_PATTERN, fullmatch=True))
    position = decode_job_cursor(cursor)
    assert isinstance(position, uuid.UUID | int)
    assert encode_cursor(position) == cursor


def test_documents_say_how_strictly_bodies_are_read(api: Document, dispatcher: Document) -> None:
    for document in (api, dispatcher):
        assert "100, not 100.0" in document["info"]["description"]
