"""Writes k8s/components/monitoring/prometheusrule.yaml from deploy/prometheus/alerts.yml,
the single source of Evora's alert rules: `python deploy/prometheus/sync_k8s_rule.py`.
tests/deploy fails when the two differ."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "deploy" / "prometheus" / "alerts.yml"
TARGET = ROOT / "k8s" / "components" / "monitoring" / "prometheusrule.yaml"

HEADER = """\
# Generated from deploy/prometheus/alerts.yml, the single source of the rules; tests/deploy
# fails when the two differ. Regenerate: python deploy/prometheus/sync_k8s_rule.py
# Prometheus Operator installs usually select rules by a label (kube-prometheus-stack:
# `release: <helm release>`); add it in the overlay.
"""


def render() -> str:
    groups = yaml.safe_load(SOURCE.read_text())
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "evora", "labels": {"app.kubernetes.io/name": "evora"}},
        "spec": groups,
    }
    return HEADER + yaml.safe_dump(rule, sort_keys=False, width=100, allow_unicode=True)


if __name__ == "__main__":
    TARGET.write_text(render())
    print(f"wrote {TARGET}")
