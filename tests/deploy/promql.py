"""Just enough PromQL reading for the deploy checks: which metric names an expression
selects, with which label matchers, and which labels it groups by. Not a parser: it relies
on the expressions being well-formed (promtool checks that where it is installed)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_IDENT = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_STRING = r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\''
_SELECTOR = re.compile(rf"({_IDENT})?\s*\{{([^}}]*)\}}")
_MATCHER = re.compile(rf"({_IDENT})\s*(=~|!~|!=|=)\s*({_STRING})")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}


@dataclass
class Selector:
    metric: str
    matchers: dict[str, str] = field(default_factory=dict)  # label -> value (unquoted)


@dataclass
class Expression:
    text: str
    selectors: list[Selector]
    grouping_labels: set[str]

    @property
    def metrics(self) -> set[str]:
        return {s.metric for s in self.selectors}


def parse(expr: str) -> Expression:
    selectors: list[Selector] = []

    def selector(match: re.Match[str]) -> str:
        name = match.group(1)
        matchers = {m.group(1): m.group(3)[1:-1] for m in _MATCHER.finditer(match.group(2))}
        if name is None:
            name = matchers.pop("__name__", "")
        if name in _KEYWORDS or name == "":
            raise ValueError(f"cannot read the selector {match.group(0)!r} in {expr!r}")
        selectors.append(Selector(name, matchers))
        return " __selector__ "

    text = _SELECTOR.sub(selector, expr)
    text = re.sub(_STRING, " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery durations
    grouping: set[str] = set()

    def group(match: re.Match[str]) -> str:
        grouping.update(label.strip() for label in match.group(2).split(",") if label.strip())
        return " "

    text = _GROUPING.sub(group, text)
    text = re.sub(r"\boffset\s+-?[0-9a-z]+", " ", text)
    for match in re.finditer(rf"(?<![\w$.]){_IDENT}", text):
        word = match.group(0)
        rest = text[match.end() :].lstrip()
        if word == "__selector__" or word.lower() in _KEYWORDS or rest.startswith("("):
            continue  # a function, an aggregation, or an operator keyword
        selectors.append(Selector(word))
    return Expression(expr, selectors, grouping)


# Label values Grafana fills in from a metric: label_values(metric, label).
_LABEL_VALUES = re.compile(rf"label_values\(\s*({_IDENT})\s*,\s*({_IDENT})\s*\)")


def label_values_query(query: str) -> tuple[str, str] | None:
    match = _LABEL_VALUES.fullmatch(query.strip())
    return (match.group(1), match.group(2)) if match else None
