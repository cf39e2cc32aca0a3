"""How failures are grouped: by error type and the message with its variable parts replaced
by placeholders, so "order 1234 not found" and "order 5678 not found" are one reason, and a
message that embeds a payload does not make a group of its own."""

from __future__ import annotations

import re

# What a reason keeps of one failure: its key text, an example message and the tail of a
# stack trace. Fifty reasons per (queue, type) of at most this much keep the document small.
MESSAGE_KEY_CHARS = 200
TRACEBACK_KEPT_CHARS = 2000

# Replaced in this order: a quoted string first (it may hold anything, numbers included),
# then the shapes of ids, then long opaque tokens, then what numbers remain.
_PLACEHOLDERS = (
    # (not an apostrophe inside a word: "can't", "user's")
    (re.compile(r"(?<!\w)'(?:[^'\\]|\\.)*'"), "'<str>'"),
    (re.compile(r'(?<!\w)"(?:[^"\\]|\\.)*"'), '"<str>"'),
    (
        re.compile(
            r"\b[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}\b"
        ),
        "<uuid>",
    ),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    # eight or more hex digits with at least one digit: hashes, addresses, ids
    (re.compile(r"\b(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]{8,}\b"), "<hex>"),
    # a run of 24+ id-like characters with a digit in it: tokens, keys, base64
    (re.compile(r"(?<![\w/+=-])(?=[\w/+=-]*\d)[\w/+=-]{24,}"), "<token>"),
    (re.compile(r"(?<![\w.])[-+]?\d+(?:[.,:]\d+)*(?![\w])"), "<n>"),
)


def normalise(message: str) -> str:
    """The message with numbers, uuids, hex, quoted strings and long tokens replaced by
    placeholders, cut at MESSAGE_KEY_CHARS."""
    text = message[: MESSAGE_KEY_CHARS * 20]  # enough to fill the key, bounded work
    for pattern, placeholder in _PLACEHOLDERS:
        text = pattern.sub(placeholder, text)
    return text[:MESSAGE_KEY_CHARS]


def traceback_tail(trace: object) -> str | None:
    """The end of a reported stack trace (where it was raised), or None."""
    if not isinstance(trace, str) or not trace:
        return None
    return trace if len(trace) <= TRACEBACK_KEPT_CHARS else "…" + trace[-TRACEBACK_KEPT_CHARS:]
