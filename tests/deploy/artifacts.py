"""The deployment artifacts the checks read: paths, and the PromQL they contain."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = ROOT / "k8s"
COMPOSE = ROOT / "docker-compose.yml"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARDS = DEPLOY / "grafana" / "dashboards"
WORKER_AUTOSCALING = K8S / "components" / "worker-autoscaling-keda" / "scaledobject.yaml"
ADAPTER_VALUES = K8S / "components" / "worker-autoscaling-hpa" / "prometheus-adapter-values.yaml"
OVERLAYS = sorted(p for p in (K8S / "overlays").iterdir() if p.is_dir())

# Services that serve /metrics, their default ports and their scrape job names.
SERVICES = {"api": 8080, "dispatcher": 8081, "sweeper": 8082, "projector": 8083}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def dashboard_queries() -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target of every dashboard."""
    for name, board in dashboards().items():
        for panel in _panels(board.get("panels", [])):
            for target in panel.get("targets", []):
                if target.get("expr"):
                    yield f"{name}: panel {panel.get('title')!r}", target["expr"]


def dashboard_variable_queries() -> Iterator[tuple[str, str]]:
    for name, board in dashboards().items():
        for variable in board.get("templating", {}).get("list", []):
            if variable.get("type") == "query":
                query = variable.get("query")
                text = query.get("query") if isinstance(query, dict) else query
                yield f"{name}: variable {variable.get('name')!r}", str(text)


def alert_rules() -> Iterator[dict[str, Any]]:
    for group in load_yaml(ALERTS)["groups"]:
        yield from group["rules"]


def alert_queries() -> Iterator[tuple[str, str]]:
    for rule in alert_rules():
        yield f"alert {rule.get('alert') or rule.get('record')}", str(rule["expr"])


def adapter_rules() -> list[dict[str, Any]]:
    """prometheus-adapter's external metric rules the worker HPA reads."""
    rules: list[dict[str, Any]] = load_yaml(ADAPTER_VALUES)["rules"]["external"]
    return rules


def adapter_query(rule: dict[str, Any], matchers: str) -> str:
    """A rule's metricsQuery as the adapter sends it for an HPA selector of `matchers`:
    its templates filled in with the series the seriesQuery names."""
    series = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rule["seriesQuery"])
    assert series, rule
    query: str = rule["metricsQuery"]
    return query.replace("<<.Series>>", series.group(0)).replace("<<.LabelMatchers>>", matchers)


def autoscaling_queries() -> Iterator[tuple[str, str]]:
    """(where, PromQL) of the worker autoscaling examples: KEDA's triggers and the
    adapter's series and metrics queries."""
    for trigger in load_yaml(WORKER_AUTOSCALING)["spec"]["triggers"]:
        yield "KEDA ScaledObject trigger", trigger["metadata"]["query"]
    for rule in adapter_rules():
        where = f"prometheus-adapter rule {rule['name']['as']}"
        yield where, rule["seriesQuery"]
        yield where, adapter_query(rule, 'queue="demo"')


@cache
def evora_subcommands() -> frozenset[str]:
    """The subcommands `evora --help` lists."""
    done = subprocess.run(
        [sys.executable, "-m", "evora_services.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
    )
    listed = re.search(r"\{([a-z,_-]+)\}", done.stdout)
    names = set(listed.group(1).split(",")) if listed else set()
    names.update(re.findall(r"^    ([a-z][a-z_-]*)\s", done.stdout, flags=re.MULTILINE))
    return frozenset(names)
