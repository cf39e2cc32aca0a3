"""What the operator commands print: aligned tables for people, JSON for scripts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

Row = Mapping[str, Any]


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        return orjson.dumps(value).decode()
    return str(value)


def table(rows: Sequence[Row], columns: Sequence[str]) -> str:
    """Left-aligned columns under an upper-case header; ids are shown whole, to be copied."""
    cells = [[cell(row.get(column)) for column in columns] for row in rows]
    header = [column.upper() for column in columns]
    widths = [max(len(line[i]) for line in [header, *cells]) for i in range(len(columns))]
    return "\n".join(
        "  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip()
        for line in [header, *cells]
    )


def record(item: Row, fields: Sequence[str] | None = None) -> str:
    """One object as `field  value` lines."""
    names = list(fields or item.keys())
    width = max((len(name) for name in names), default=0)
    return "\n".join(f"{name.ljust(width)}  {cell(item.get(name))}" for name in names)


def as_json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
