"""The SQL statements of `evora.storage`, read by name from the files in `sql/`.

Each statement is written whole in its file, after a `-- name: <name>` line and the comment
that documents its parameters; a statement ends with the `;` that closes its last line. A
rule several statements and functions state alike is written once in `rules.sql` and put in
where a text says `{{rule:<name>}}` (`with_rules`). The
files are read once, when the module that uses them is imported, and each module names
every statement it takes from its file: a missing or a left-over statement fails there, not
at the first request.
"""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^-- name: ([a-z][a-z0-9_]*)\s*$")
_RULE = re.compile(r"\{\{rule:([a-z][a-z0-9_]*)\}\}")


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


def _rules() -> dict[str, str]:
    return parse(resources.files("evora.storage").joinpath("rules.sql").read_text("utf-8"))


_RULES = _rules()


def with_rules(text: str) -> str:
    """`text` with each `{{rule:<name>}}` replaced by that rule of rules.sql, in parentheses
    on lines of its own (a rule may hold comments); an unknown rule is an error."""

    def rule(match: re.Match[str]) -> str:
        if match[1] not in _RULES:
            raise ValueError(f"no rule {match[1]!r} in rules.sql")
        line = text[text.rfind("\n", 0, match.start()) + 1 : match.start()]
        if "--" in line:
            # the rule's own lines would end the comment and run as SQL
            raise ValueError(f"the rule {match[1]!r} is named in a comment: {line.strip()!r}")
        return f"(\n{_RULES[match[1]]}\n)"

    return _RULE.sub(rule, text)


def load(file: str, *names: str) -> tuple[str, ...]:
    """The statements `names` of `sql/<file>.sql`, in that order. The file must hold exactly
    these, so a statement nothing uses cannot linger in it."""
    text = resources.files("evora.storage").joinpath("sql", f"{file}.sql").read_text("utf-8")
    statements = parse(text)
    if set(names) != set(statements) or len(names) != len(set(names)):
        raise ValueError(
            f"sql/{file}.sql holds {sorted(statements)}, its module asks for {sorted(names)}"
        )
    return tuple(with_rules(statements[name]) for name in names)
