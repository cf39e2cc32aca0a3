"""OpenAPI 3.1 generated from the endpoint declarations and their pydantic models.

The document is meant to be exactly as strict as the server: path and query parameters
carry the types the handlers check, bodies the models' constraints (cross-field rules
included where JSON Schema can say them, in descriptions where it cannot), and every
status an endpoint can answer with is declared with its body (problem+json for errors).
A schema-driven fuzzer (tests/fuzz) checks that against the running services.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web
from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import models_json_schema

from evora.http.problems import PROBLEM_CONTENT_TYPE
from evora.http.routing import Endpoint, all_endpoints

_PATH_PARAM = re.compile(r"\{(\w+)\}")
_REF_TEMPLATE = "#/components/schemas/{model}"

_PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "title", "status", "detail", "code"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "code": {"type": "string"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "loc": {"type": "array", "items": {"type": ["string", "integer"]}},
                    "msg": {"type": "string"},
                    "type": {"type": "string"},
                },
            },
        },
    },
}

_PROBLEM_DESCRIPTIONS = {
    400: "Malformed JSON (code malformed_json).",
    401: "Missing or unknown token (code unauthorized).",
    403: "The token's role may not call this endpoint (code forbidden).",
    404: "Not found (e.g. code job_not_found).",
    408: (
        "The body arrived slower than the minimum rate after a grace period (code "
        "request_timeout); the request was not processed."
    ),
    409: "Conflict (codes invalid_state, lease_lost, idempotency_conflict).",
    413: "Body or payload over the size limit (code payload_too_large).",
    422: "Validation error (code validation_error).",
    503: (
        "The database (or, for read-model endpoints, MongoDB) is unavailable; retry "
        "(codes unavailable, read_models_unavailable)."
    ),
}
# What JSON Schema cannot say about every body (it treats 100.0 as the integer 100).
_DOCUMENT_NOTES = (
    "Bodies are read strictly: an integer field takes a JSON integer written without a "
    "fraction or exponent (100, not 100.0 or 1e2), a string field only a string; anything "
    "else is a 422. An empty body counts as {}."
)

# Statuses whose answer has no body.
_NO_BODY = {204, 304}
_NULL = {"type": "null"}


def _models(endpoints: list[Endpoint]) -> list[type[BaseModel]]:
    seen: dict[str, type[BaseModel]] = {}
    for e in endpoints:
        for model in (e.body, e.query, *e.responses.values()):
            if model is not None:
                seen[model.__name__] = model
    return list(seen.values())


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """An optional query parameter is left out rather than sent as null, which a query
    string cannot say; pydantic's `X | None` becomes just X."""
    options = schema.get("anyOf")
    if not options or _NULL not in options:
        return schema
    rest = [o for o in options if o != _NULL]
    others = {k: v for k, v in schema.items() if k != "anyOf" and (k, v) != ("default", None)}
    return {**rest[0], **others} if len(rest) == 1 else {**others, "anyOf": rest}


def _query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    # Nested models (e.g. an enum) are in components/schemas, which the main document's
    # models_json_schema call fills; the references must point there too.
    schema = model.model_json_schema(ref_template=_REF_TEMPLATE)
    required = set(schema.get("required", []))
    return [
        {"name": name, "in": "query", "required": name in required, "schema": _without_null(prop)}
        for name, prop in schema.get("properties", {}).items()
    ]


def _path_parameters(e: Endpoint) -> list[dict[str, Any]]:
    # aiohttp matches a path parameter only to a non-empty segment.
    untyped: dict[str, Any] = {"type": "string", "minLength": 1}
    return [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": TypeAdapter(e.path_params[name]).json_schema(ref_template=_REF_TEMPLATE)
            if name in e.path_params
            else untyped,
        }
        for name in _PATH_PARAM.findall(e.path)
    ]


def _problem_response(status: int) -> dict[str, Any]:
    schema = {
        "allOf": [{"$ref": "#/components/schemas/Problem"}],
        "properties": {"status": {"const": status}},
    }
    return {
        "description": _PROBLEM_DESCRIPTIONS.get(status, "Error"),
        "content": {PROBLEM_CONTENT_TYPE: {"schema": schema}},
    }


def _answer(e: Endpoint, status: int, model: type[BaseModel] | None) -> dict[str, Any]:
    response: dict[str, Any] = {"description": "OK" if status < 300 else "See body"}
    if model is not None:
        response["content"] = {e.content_types[0]: {"schema": _ref(model)}}
    elif status not in _NO_BODY:
        response["content"] = {content_type: {} for content_type in e.content_types}
    return response


def _operation(e: Endpoint) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": e.summary, "tags": [e.tag]}
    params = _path_parameters(e)
    if e.query is not None:
        params += _query_parameters(e.query)
        if e.query.model_config.get("extra") == "forbid":
            op["description"] = "Unknown query parameters are refused (422)."
    if params:
        op["parameters"] = params
    problems = set(e.problems)
    if e.roles is not None:
        op["security"] = [{"bearer": []}]
        problems |= {401, 403}
    if e.body is not None:
        # An empty body counts as {} (see bodies.parse_body), so a body whose fields are
        # all optional may be left out.
        op["requestBody"] = {
            "required": bool(e.body.model_json_schema().get("required")),
            "content": {"application/json": {"schema": _ref(e.body)}},
        }
        problems |= {400, 408, 413, 422}
    if e.query is not None:
        problems.add(422)
    responses = {
        str(status): _answer(e, status, model) for status, model in sorted(e.responses.items())
    }
    responses |= {str(status): _problem_response(status) for status in sorted(problems)}
    op["responses"] = responses
    return op


def openapi_document(app: web.Application, title: str) -> dict[str, Any]:
    endpoints = sorted(all_endpoints(app), key=lambda e: (e.path, e.method))
    _, schemas = models_json_schema(
        [(m, "validation") for m in _models(endpoints)],
        ref_template=_REF_TEMPLATE,
    )
    components: dict[str, Any] = dict(schemas.get("$defs", {}))
    components["Problem"] = _PROBLEM_SCHEMA
    paths: dict[str, dict[str, Any]] = {}
    for e in endpoints:
        paths.setdefault(e.path, {})[e.method.lower()] = _operation(e)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1", "description": _DOCUMENT_NOTES},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
