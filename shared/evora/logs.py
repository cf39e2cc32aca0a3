"""Structured logs: one JSON object per line on stderr (or a human-readable line).

Every record carries `ts` (RFC 3339, UTC, milliseconds), `level`, `logger` and `msg`, the
process's `service`, and any context bound for the code that logged it: the HTTP middleware
binds `request_id` for the duration of a request, the worker SDK binds `job_id`, `queue` and
`job_type` while a job runs. Fields passed as `extra={...}` to a logging call are included as
well. `EVORA_LOG_FORMAT=text` switches to one readable line per record with the same fields
appended as `key=value`.

No token reaches the output: the handler's `Redaction` filter replaces whatever follows
"Bearer " and every registered secret (the configured tokens) in the message, its arguments,
the fields, exception tracebacks and stacks, for Evora's own records and for those of
aiohttp, asyncio and any other library alike (aiohttp logs the raw header line of a request
it cannot parse, Authorization included).
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Literal

import orjson

LogFormat = Literal["json", "text"]

REDACTED = "[redacted]"
# A bearer credential up to the next space or quote: the quote ends it inside a repr (aiohttp
# shows the offending header line as `b'Authorization: Bearer ...'`).
_BEARER = r"(?P<scheme>\bbearer\s+)[^\s'\"]+"

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
    for value in fields.values():
        if value is None:
            fields = {k: v for k, v in fields.items() if v is not None}
            break
    bound = _CONTEXT.get()
    # `fields` is this call's own dict, which nothing else holds or changes: with nothing
    # bound before (a job's task in the worker, a request in a service) it is the context
    # as it is, one dict per bind rather than three.
    return _CONTEXT.set({**bound, **fields} if bound else fields)


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


def _extra(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a logging call added (`extra=`), or a filter."""
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD and k[:1] != "_"}


def _fields(record: logging.LogRecord, service: str | None) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if service is not None:
        fields["service"] = service
    fields.update(_CONTEXT.get())
    fields.update(_extra(record))
    return fields


def _timestamp(record: logging.LogRecord) -> str:
    at = datetime.fromtimestamp(record.created, UTC)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Formatter(logging.Formatter):
    def __init__(self, service: str | None = None) -> None:
        super().__init__()
        self.service = service

    def exception_text(self, record: logging.LogRecord) -> str | None:
        """The traceback, formatted once per record (as `logging.Formatter` caches it), so
        that the text `Redaction` cleaned is the text written."""
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        return record.exc_text or None


class JsonFormatter(_Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _fields(record, self.service).items():
            event.setdefault(key, value)
        if exc := self.exception_text(record):
            event["exc"] = exc
        if record.stack_info:
            event["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(event, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


class TextFormatter(_Formatter):
    """`2026-01-01T00:00:00.000Z INFO logger: message key=value ...` for people."""

    def format(self, record: logging.LogRecord) -> str:
        fields = _fields(record, None)  # every line of a process has the same service
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if fields:
            line += " " + " ".join(f"{key}={value}" for key, value in fields.items())
        if exc := self.exception_text(record):
            line += "\n" + exc
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


_PLAIN = logging.Formatter()  # formats tracebacks exactly as the formatters above do


def _replacement(match: re.Match[str]) -> str:
    return (match.group("scheme") or "") + REDACTED


class Redaction(logging.Filter):
    """Rewrites a record so that no bearer token or registered secret is left in it.

    Installed on the handler, it sees every record the handler writes, whichever logger
    made it. The record is changed in place, so other handlers get the cleaned one too.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self._secrets: frozenset[str] = frozenset()
        self._pattern = re.compile(_BEARER, re.IGNORECASE)
        self.add_secrets(secrets)

    def add_secrets(self, secrets: Iterable[str]) -> None:
        """Also redact these exact values wherever they appear (tokens generated later)."""
        self._secrets |= {secret for secret in secrets if secret}
        # Longest first, so a secret that contains another is replaced whole.
        literals = sorted(self._secrets, key=len, reverse=True)
        self._pattern = re.compile("|".join([_BEARER, *map(re.escape, literals)]), re.IGNORECASE)

    def redact(self, text: str) -> str:
        return self._pattern.sub(_replacement, text)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: keep both parts rather than fail the caller
            message = f"{record.msg!s} {record.args!r}"
        record.msg, record.args = self.redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = _PLAIN.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        # The bound context joins the record's own fields (which take precedence, as in
        # `_fields`), so that a client-chosen value such as the request id is cleaned too.
        for key, value in {**_CONTEXT.get(), **_extra(record)}.items():
            if isinstance(value, str):
                value = self.redact(value)
            record.__dict__[key] = value
        return True


def configure_logging(
    level: str, fmt: LogFormat, service: str | None = None, secrets: Iterable[str] = ()
) -> None:
    """Root logger to stderr in `fmt`, with bearer tokens and `secrets` redacted; replaces
    handlers configured before."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service) if fmt == "json" else TextFormatter(service))
    handler.addFilter(Redaction(secrets))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)


def configure_default_logging(secrets: Iterable[str] = ()) -> bool:
    """For a program that configured no logging (the root logger has no handler, as in a
    script that just calls `worker.run()`): readable lines at INFO on stderr, so that what
    the worker says is seen, with `secrets` redacted. A program's own configuration is left
    alone, handlers and level both. Returns whether logging was configured here."""
    root = logging.getLogger()
    if root.handlers:
        return False
    # A level the program chose without a handler (`root.setLevel(DEBUG)`) is kept.
    level = logging.getLevelName(root.level) if root.level != logging.WARNING else "INFO"
    configure_logging(level, "text", secrets=secrets)
    return True


def redact_secrets(secrets: Iterable[str]) -> None:
    """Redact these too from now on, on every handler `configure_logging` set up (for
    secrets known only later, such as the tokens `evora dev` generates)."""
    values = list(secrets)
    for handler in logging.getLogger().handlers:
        for found in handler.filters:
            if isinstance(found, Redaction):
                found.add_secrets(values)
