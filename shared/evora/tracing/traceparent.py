"""The W3C Trace Context `traceparent` header (https://www.w3.org/TR/trace-context/), as the
api accepts it from producers: strictly checked, since it is stored with the job and handed
to workers. Anything malformed is ignored (the job carries no trace), never an error."""

from __future__ import annotations

import re

# version 00: version-traceid-parentid-flags, lowercase hex
_VERSION_00 = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
LENGTH = 55
# A later version may append fields after these; a header longer than this is not one.
MAX_LENGTH = 512
_ZERO_TRACE = "0" * 32
_ZERO_PARENT = "0" * 16


def valid_traceparent(value: str | None) -> str | None:
    """`value` as a version-00 traceparent, or None when it is absent or malformed. A
    later version (not `ff`) is read by its first four fields, as the specification asks,
    and kept as version 00; trace and parent ids of all zeros are invalid."""
    if value is None or len(value) > MAX_LENGTH:
        return None
    value = value.strip(" \t")
    version = value[:2]
    if version != "00":
        if not re.fullmatch(r"[0-9a-f]{2}", version) or version == "ff":
            return None
        if len(value) > LENGTH and value[LENGTH] != "-":
            return None
        value = "00" + value[2:LENGTH]
    match = _VERSION_00.fullmatch(value)
    if match is None or match[1] == _ZERO_TRACE or match[2] == _ZERO_PARENT:
        return None
    return value
