"""Structured logs: one JSON object per line on stderr (or a human-readable line).

Every record carries `ts` (RFC 3339, UTC, milliseconds), `level`, `logger` and `msg`, the
process's `service`, and any context bound for the code that logged it: the HTTP middleware
binds `request_id` for the duration of a request, the worker SDK binds `job_id`, `queue` and
`job_type` while a job runs. Fields passed as `extra={...}` to a logging call are included as
well. `EVORA_LOG_FORMAT=text` switches to one readable line per record with the same fields
appended as `key=value`.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator, Mapping
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Literal

import orjson

LogFormat = Literal["json", "text"]

# Fields bound for the current task (and the tasks it creates, which copy the context).
_CONTEXT: ContextVar[Mapping[str, Any]] = ContextVar(
    "evora_log_context", default=MappingProxyType({})
)

# Attributes every LogRecord has; anything else on a record came from `extra=` or a filter.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


ContextToken = Token[Mapping[str, Any]]


def bind(**fields: Any) -> ContextToken:
    """Add fields (None values are left out) to the log context of this task and of the
    tasks it creates from now on; undo with `unbind(token)` in the same task."""
    return _CONTEXT.set({**_CONTEXT.get(), **{k: v for k, v in fields.items() if v is not None}})


def unbind(token: ContextToken) -> None:
    _CONTEXT.reset(token)


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Fields added to every record logged inside the block, and in tasks created there."""
    token = bind(**fields)
    try:
        yield
    finally:
        unbind(token)


def context() -> Mapping[str, Any]:
    """The fields bound now (for tests and for code that forwards them)."""
    return _CONTEXT.get()


def _fields(record: logging.LogRecord, service: str | None) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if service is not None:
        fields["service"] = service
    fields.update(_CONTEXT.get())
    for key, value in record.__dict__.items():
        if key not in _STANDARD and not key.startswith("_"):
            fields[key] = value
    return fields


def _timestamp(record: logging.LogRecord) -> str:
    at = datetime.fromtimestamp(record.created, UTC)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def __init__(self, service: str | None = None) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _fields(record, self.service).items():
            event.setdefault(key, value)
        if record.exc_info:
            event["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            event["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(event, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


class TextFormatter(logging.Formatter):
    """`2026-01-01T00:00:00.000Z INFO logger: message key=value ...` for people."""

    def __init__(self, service: str | None = None) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        fields = _fields(record, None)  # every line of a process has the same service
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if fields:
            line += " " + " ".join(f"{key}={value}" for key, value in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


def configure_logging(level: str, fmt: LogFormat, service: str | None = None) -> None:
    """Root logger to stderr in `fmt`; replaces handlers configured before."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service) if fmt == "json" else TextFormatter(service))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)
