"""The alert rules: the structure every rule needs, the alerts the runbook promises, and
`promtool check rules` / `check config` / `test rules` where promtool is installed
(scripts/test.sh installs it from Debian's `prometheus` package)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy import artifacts

SEVERITIES = {"warning", "critical"}
DURATION = re.compile(r"^[0-9]+[smhdwy]$")


def test_rule_file_structure() -> None:
    doc = artifacts.load_yaml(artifacts.ALERTS)
    assert set(doc) == {"groups"}
    names = set()
    for group in doc["groups"]:
        assert set(group) <= {"name", "interval", "rules"} and group["rules"], group.get("name")
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            name = rule["alert"]
            assert re.fullmatch(r"Evora[A-Za-z]+", name) and name not in names, name
            names.add(name)
            assert isinstance(rule["expr"], str) and rule["expr"].strip(), name
            assert DURATION.match(rule["for"]), name
            assert rule["labels"]["severity"] in SEVERITIES, name
            assert {"summary", "description"} <= set(rule["annotations"]), name
            # balanced brackets: a cheap syntax check when promtool is missing
            for pair in ("()", "{}", "[]"):
                assert rule["expr"].count(pair[0]) == rule["expr"].count(pair[1]), name


def test_the_promised_alerts_exist() -> None:
    expressions = {rule["alert"]: rule["expr"] for rule in artifacts.alert_rules()}
    wanted = {
        "projector lag": "evora_projector_seconds_behind",
        "DLQ growth": 'evora_queue_jobs{state="DLQ"}',
        "oldest pending job age": "evora_queue_oldest_pending_age_seconds",
        "oldest writing transaction": "evora_sweeper_oldest_writing_transaction_seconds",
        "lease-expiry spike": "evora_sweeper_leases_expired_total",
        "service down": 'up{job=~"evora-.*"} == 0',
    }
    for what, fragment in wanted.items():
        assert any(fragment in expr for expr in expressions.values()), what


def _promtool() -> str:
    found = shutil.which("promtool") or str(Path(sys.executable).with_name("promtool"))
    if not Path(found).exists():
        pytest.skip("promtool is not installed (scripts/test.sh installs it)")
    return found


def _run(*args: str) -> str:
    done = subprocess.run(
        [_promtool(), *args], capture_output=True, text=True, timeout=60, cwd=artifacts.ROOT
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_promtool_check_rules_and_config() -> None:
    out = _run("check", "rules", str(artifacts.ALERTS))
    assert "SUCCESS" in out
    assert "SUCCESS" in _run("check", "config", str(artifacts.PROMETHEUS_CONFIG))


def test_promtool_alert_unit_tests() -> None:
    """deploy/prometheus/alerts_test.yml: the alerts fire on made-up series and stay quiet
    on healthy ones."""
    out = _run("test", "rules", str(artifacts.DEPLOY / "prometheus" / "alerts_test.yml"))
    assert "SUCCESS" in out
