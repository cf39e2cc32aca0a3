"""The SQL statements of `evora.storage`, read by name from the files in `sql/`.

Each statement is written whole in its file, after a `-- name: <name>` line and the comment
that documents its parameters; a statement ends with the `;` that closes its last line. The
files are read once, when the module that uses them is imported, and each module names
every statement it takes from its file: a missing or a left-over statement fails there, not
at the first request.
"""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^-- name: ([a-z][a-z0-9_]*)\s*$")


def parse(text: str) -> dict[str, str]:
    """{name: statement} of one file: comments before and inside a statement are kept in
    it (PostgreSQL ignores them); text before the first name is the file's own comment."""
    statements: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []

    def close() -> None:
        if name is None:
            return
        body = "\n".join(lines).strip()
        if not body.endswith(";"):
            raise ValueError(f"statement {name!r} does not end with ';'")
        statements[name] = body[:-1]

    for line in text.splitlines():
        match = _NAME.match(line)
        if match:
            close()
            name, lines = match[1], []
            if name in statements:
                raise ValueError(f"statement {name!r} is named twice")
        elif name is not None:
            lines.append(line)
    close()
    return statements


def load(file: str, *names: str) -> tuple[str, ...]:
    """The statements `names` of `sql/<file>.sql`, in that order. The file must hold exactly
    these, so a statement nothing uses cannot linger in it."""
    text = resources.files("evora.storage").joinpath("sql", f"{file}.sql").read_text("utf-8")
    statements = parse(text)
    if set(names) != set(statements) or len(names) != len(set(names)):
        raise ValueError(
            f"sql/{file}.sql holds {sorted(statements)}, its module asks for {sorted(names)}"
        )
    return tuple(statements[name] for name in names)
