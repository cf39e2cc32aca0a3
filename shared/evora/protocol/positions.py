"""`Evora-Read-After`: a position in the primary PostgreSQL's write-ahead log, which the api
answers with and a client sends back, so that a read served by a replica is never older
than what the client has written or seen (docs/http-api.md#read-after, docs/scaling.md).

A position is PostgreSQL's LSN text, two hexadecimal numbers of at most 8 digits each
(`16/B374D848`); as a number it is the upper one shifted left by 32 plus the lower one.
"""

from __future__ import annotations

import re
from typing import Final

READ_AFTER_HEADER: Final = "Evora-Read-After"

_LSN = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")


def parse_position(text: str) -> int | None:
    """The position `text` names, or None when it is not an LSN."""
    match = _LSN.fullmatch(text.strip())
    if match is None:
        return None
    return (int(match[1], 16) << 32) | int(match[2], 16)


def format_position(position: int) -> str:
    """The LSN text of `position`, as PostgreSQL writes it."""
    return f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"
