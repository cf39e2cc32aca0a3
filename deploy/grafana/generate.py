"""Writes deploy/grafana/dashboards/evora.json, the Evora Grafana dashboard.

The dashboard is generated so that its panels stay uniform and every query is in one
readable place; tests/deploy checks that the committed JSON is what this script writes and
that every metric a query names is exported by the services. After editing:

    python deploy/grafana/generate.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "dashboards" / "evora.json"
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
RATE = "$__rate_interval"
Q = 'queue=~"$queue"'

Panel = dict[str, Any]


class Layout:
    def __init__(self) -> None:
        self.panels: list[Panel] = []
        self.y = 0
        self.x = 0
        self.row_height = 0
        self.next_id = 1

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "id": self._id(),
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                "panels": [],
            }
        )
        self.y += 1

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_height
            self.x = 0
            self.row_height = 0

    def add(self, panel: Panel, w: int, h: int) -> None:
        if self.x + w > 24:
            self._newline()
        panel["id"] = self._id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.panels.append(panel)
        self.x += w
        self.row_height = max(self.row_height, h)


def _targets(queries: list[tuple[str, str]]) -> list[dict[str, Any]]:
    return [
        {
            "datasource": DATASOURCE,
            "expr": expr,
            "legendFormat": legend,
            "refId": chr(ord("A") + i),
        }
        for i, (expr, legend) in enumerate(queries)
    ]


def timeseries(
    title: str,
    queries: list[tuple[str, str]],
    *,
    unit: str = "short",
    description: str = "",
    stack: bool = False,
    minimum: float | None = 0,
) -> Panel:
    defaults: dict[str, Any] = {
        "unit": unit,
        "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 20 if stack else 5,
            "showPoints": "never",
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        },
    }
    if minimum is not None:
        defaults["min"] = minimum
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": _targets(queries),
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def stat(title: str, expr: str, *, unit: str = "short", description: str = "") -> Panel:
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": _targets([(expr, "")]),
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "auto",
        },
    }


def quantiles(metric: str, by: str, where: str = "") -> list[tuple[str, str]]:
    """p50/p95/p99 of a histogram, per `by` label(s)."""
    matcher = "{" + where + "}" if where else ""
    legend_by = " ".join("{{" + label.strip() + "}}" for label in by.split(",")) if by else ""
    group = f"le, {by}" if by else "le"
    return [
        (
            f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{matcher}[{RATE}])))",
            f"p{round(q * 100)} {legend_by}".strip(),
        )
        for q in (0.5, 0.95, 0.99)
    ]


def build() -> dict[str, Any]:
    d = Layout()

    d.row("Queues")
    d.add(stat("Pending", f'sum(max by (queue) (evora_queue_jobs{{state="PENDING", {Q}}}))'), 4, 4)
    d.add(stat("Running", f'sum(max by (queue) (evora_queue_jobs{{state="RUNNING", {Q}}}))'), 4, 4)
    d.add(stat("DLQ", f'sum(max by (queue) (evora_queue_jobs{{state="DLQ", {Q}}}))'), 4, 4)
    d.add(
        stat(
            "Oldest pending job",
            f"max(evora_queue_oldest_pending_age_seconds{{{Q}}})",
            unit="s",
            description="How long the longest-waiting claimable job has been due.",
        ),
        4,
        4,
    )
    d.add(
        stat(
            "Completed / s",
            f'sum(rate(evora_queue_events_total{{event="completed", {Q}}}[{RATE}]))',
            unit="ops",
        ),
        4,
        4,
    )
    d.add(
        stat("Read models behind", "max(evora_projector_seconds_behind)", unit="s"),
        4,
        4,
    )
    d.add(
        timeseries(
            "Queue depth by state",
            [
                (
                    "max by (queue, state) "
                    f'(evora_queue_jobs{{state=~"PENDING|RUNNING|DLQ", {Q}}})',
                    "{{queue}} {{state}}",
                )
            ],
            description="Jobs per queue and state, from the read models (the active projector "
            "exports them).",
        ),
        12,
        8,
    )
    d.add(
        timeseries(
            "Submit / claim / complete / fail rate",
            [
                (
                    f"sum by (event) (rate(evora_queue_events_total{{"
                    f'event=~"submitted|claimed|completed|failed|dead_lettered|cancelled", {Q}}}'
                    f"[{RATE}]))",
                    "{{event}}",
                )
            ],
            unit="ops",
            description="Outbox events per second, as projected.",
        ),
        12,
        8,
    )
    d.add(
        timeseries(
            "Completed per queue",
            [
                (
                    f'sum by (queue) (rate(evora_queue_events_total{{event="completed", {Q}}}'
                    f"[{RATE}]))",
                    "{{queue}}",
                )
            ],
            unit="ops",
        ),
        12,
        8,
    )
    d.add(
        timeseries(
            "Oldest pending job age",
            [(f"max by (queue) (evora_queue_oldest_pending_age_seconds{{{Q}}})", "{{queue}}")],
            unit="s",
        ),
        12,
        8,
    )
    d.add(
        timeseries(
            "Wait latency (due to claimed)",
            [
                (
                    f'max by (queue, quantile) (evora_queue_latency_seconds{{kind="wait", {Q}}})',
                    "{{queue}} p{{quantile}}",
                )
            ],
            unit="s",
            description="Percentiles over the queue's most recent claims (read models).",
        ),
        12,
        8,
    )
    d.add(
        timeseries(
            "Run latency (claimed to completed)",
            [
                (
                    f'max by (queue, quantile) (evora_queue_latency_seconds{{kind="run", {Q}}})',
                    "{{queue}} p{{quantile}}",
                )
            ],
            unit="s",
            description="Percentiles over the queue's most recent completions (read models).",
        ),
        12,
        8,
    )
    d.add(
        timeseries(
            "DLQ size",
            [(f'max by (queue) (evora_queue_jobs{{state="DLQ", {Q}}})', "{{queue}}")],
        ),
        12,
        8,
    )
    d.add(
        timeseries(
            "DLQ growth (dead-lettered / retried per minute)",
            [
                (
                    f'sum by (queue) (rate(evora_queue_events_total{{event="dead_lettered", {Q}}}'
                    f"[{RATE}])) * 60",
                    "{{queue}} dead-lettered",
                ),
                (
                    f'sum by (queue) (rate(evora_queue_events_total{{event="retried", {Q}}}'
                    f"[{RATE}])) * 60",
                    "{{queue}} retried",
                ),
            ],
        ),
        12,
        8,
    )

    d.row("Dispatcher")
    d.add(
        timeseries(
            "Waiting long-polls",
            [(f"sum by (queue) (evora_dispatcher_waiting_polls{{{Q}}})", "{{queue}}")],
            stack=True,
        ),
        8,
        8,
    )
    d.add(
        timeseries(
            "Jobs handed out",
            [
                (
                    f"sum by (queue) (rate(evora_dispatcher_jobs_claimed_total{{{Q}}}[{RATE}]))",
                    "{{queue}}",
                )
            ],
            unit="ops",
        ),
        8,
        8,
    )
    d.add(
        timeseries(
            "Acks by outcome and answer",
            [
                (
                    f"sum by (outcome, status) (rate(evora_dispatcher_acks_total[{RATE}]))",
                    "{{outcome}} {{status}}",
                )
            ],
            unit="ops",
        ),
        8,
        8,
    )
    d.add(
        timeseries(
            "Claim query latency",
            quantiles("evora_dispatcher_claim_duration_seconds", ""),
            unit="s",
        ),
        8,
        8,
    )
    d.add(
        timeseries(
            "Long-poll wake-ups by cause",
            [
                (
                    f"sum by (cause) (rate(evora_dispatcher_wakeups_total[{RATE}]))",
                    "{{cause}}",
                )
            ],
            unit="ops",
        ),
        8,
        8,
    )
    d.add(
        timeseries(
            "LISTEN connection / undeliverable releases",
            [
                (
                    "min by (instance) (evora_dispatcher_listener_connected)",
                    "listening {{instance}}",
                ),
                (
                    f"sum(rate(evora_dispatcher_undeliverable_jobs_released_total[{RATE}]))",
                    "released undeliverable / s",
                ),
            ],
        ),
        8,
        8,
    )

    d.row("Flow control (limits)")
    d.add(
        timeseries(
            "Running under limits, by key kind",
            [("max by (kind) (evora_limit_running_jobs)", "{{kind}}")],
            description="RUNNING jobs holding a limited key, summed over the keys of each kind "
            "(what precedes the key's first ':'; queue: for queue limits).",
        ),
        8,
        8,
    )
    d.add(
        timeseries(
            "Throttled jobs, by key kind",
            [
                ("max by (kind) (evora_limit_throttled_jobs)", "held back {{kind}}"),
            ],
            description="Due PENDING jobs held back because a key they hold has no room left "
            "(concurrency reached or bucket empty).",
        ),
        8,
        8,
    )
    d.add(
        timeseries(
            "Time throttled and tokens, by key kind",
            [
                ("max by (kind) (evora_limit_throttled_seconds)", "longest wait {{kind}} (s)"),
                ("max by (kind) (evora_limit_tokens)", "tokens {{kind}}"),
            ],
            description="How long the longest-held-back job of each kind has been due, and the "
            "tokens left in the buckets of its rate-limited keys.",
        ),
        8,
        8,
    )

    d.row("Sweeper")
    d.add(
        timeseries(
            "Lease expiries by outcome",
            [
                (
                    f"sum by (outcome) (rate(evora_sweeper_leases_expired_total[{RATE}])) * 60",
                    "{{outcome}}",
                ),
                (f"sum(rate(evora_sweeper_ttls_expired_total[{RATE}])) * 60", "TTL expired"),
            ],
            description="Per minute.",
        ),
        8,
        8,
    )
    d.add(
        timeseries(
            "Rows pruned by retention",
            [
                (
                    f"sum by (kind) (rate(evora_sweeper_pruned_total[{RATE}])) * 60",
                    "{{kind}}",
                )
            ],
            description="Per minute.",
        ),
        8,
        8,
    )
    d.add(
        timeseries(
            "Expiry pass",
            [
                *quantiles("evora_sweeper_pass_duration_seconds", ""),
                (
                    "time() - max(evora_sweeper_last_run_timestamp_seconds)",
                    "since last pass",
                ),
            ],
            unit="s",
        ),
        8,
        8,
    )
    d.add(
        timeseries(
            "Active replicas (sweeper, projector)",
            [
                ("max by (instance) (evora_sweeper_active)", "sweeper {{instance}}"),
                ("max by (instance) (evora_projector_active)", "projector {{instance}}"),
            ],
            description="1 on the replica holding the lock; the others are standbys.",
        ),
        8,
        8,
    )
    d.add(
        timeseries(
            "Oldest writing transaction",
            [("max(evora_sweeper_oldest_writing_transaction_seconds)", "age")],
            unit="s",
            description="It pins the outbox horizon and what vacuum may remove.",
        ),
        8,
        8,
    )
    d.add(
        timeseries("Dead tuples in jobs", [("max(evora_jobs_dead_tuples)", "n_dead_tup")]),
        8,
        8,
    )
    d.add(
        timeseries(
            "Schedule ticks",
            [
                (f"sum(rate(evora_schedule_ticks_fired_total[{RATE}])) * 60", "fired"),
                (f"sum(rate(evora_schedule_ticks_missed_total[{RATE}])) * 60", "missed"),
            ],
            description="Per minute, all replicas. Missed: passed over by a misfire policy "
            "after downtime (docs/schedules.md).",
        ),
        8,
        8,
    )
    d.add(
        timeseries(
            "Schedule fire delay",
            quantiles("evora_schedule_fire_delay_seconds", ""),
            unit="s",
            description="From a tick to the making of its job.",
        ),
        8,
        8,
    )

    d.row("Projector")
    d.add(
        timeseries(
            "Projector lag",
            [("max(evora_projector_seconds_behind)", "seconds behind")],
            unit="s",
        ),
        8,
        8,
    )
    d.add(
        timeseries(
            "Events behind / applied",
            [
                ("max(evora_projector_events_behind)", "behind"),
                (f"sum(rate(evora_projector_events_total[{RATE}]))", "applied / s"),
            ],
        ),
        8,
        8,
    )
    d.add(
        timeseries("Batch apply latency", quantiles("evora_projector_apply_seconds", ""), unit="s"),
        8,
        8,
    )
    d.add(
        timeseries(
            "MongoDB writes by collection",
            [
                (
                    f"sum by (collection) (rate(evora_projector_mongo_writes_total[{RATE}]))",
                    "{{collection}}",
                )
            ],
            unit="ops",
        ),
        8,
        8,
    )
    d.add(
        timeseries(
            "Batch size / conflicts",
            [
                (
                    f"sum(rate(evora_projector_batch_size_sum[{RATE}])) "
                    f"/ sum(rate(evora_projector_batch_size_count[{RATE}]))",
                    "mean events per batch",
                ),
                (f"sum(increase(evora_projector_conflicts_total[{RATE}]))", "conflicts"),
            ],
        ),
        8,
        8,
    )
    d.add(
        timeseries(
            "Newest event applied",
            [("max(evora_projector_last_seq)", "seq")],
            minimum=None,
        ),
        8,
        8,
    )
    d.add(
        timeseries(
            "PostgreSQL history",
            [
                (
                    f"sum(increase(evora_projector_history_changes_total[{RATE}]))",
                    "history changes (each starts a rebuild)",
                ),
                ("max(evora_projector_history_check_off)", "check off"),
            ],
            description="A change of PostgreSQL's history (a failover, a switchover, a "
            "restore) rebuilds the read models. Check off (1): the server refuses the history, "
            "and a failover goes unnoticed: run `evora projector --rebuild` after one.",
        ),
        8,
        8,
    )

    d.row("HTTP")
    d.add(
        timeseries(
            "Requests by service and status",
            [
                (
                    f"sum by (service, status) (rate(evora_http_requests_total[{RATE}]))",
                    "{{service}} {{status}}",
                )
            ],
            unit="reqps",
        ),
        12,
        8,
    )
    d.add(
        timeseries(
            "Error ratio (5xx) per service",
            [
                (
                    f'sum by (service) (rate(evora_http_requests_total{{status=~"5.."}}[{RATE}])) '
                    f"/ sum by (service) (rate(evora_http_requests_total[{RATE}]))",
                    "{{service}} 5xx",
                ),
                (
                    f'sum by (service) (rate(evora_http_requests_total{{status=~"4.."}}[{RATE}])) '
                    f"/ sum by (service) (rate(evora_http_requests_total[{RATE}]))",
                    "{{service}} 4xx",
                ),
            ],
            unit="percentunit",
        ),
        12,
        8,
    )
    d.add(
        timeseries(
            "Latency per service (long-poll claims excluded)",
            quantiles(
                "evora_http_request_duration_seconds",
                "service",
                'route!~"/v1/claim|/metrics"',
            ),
            unit="s",
        ),
        12,
        8,
    )
    d.add(
        timeseries(
            "Latency per route",
            [
                (
                    "histogram_quantile(0.99, sum by (le, service, method, route) "
                    f"(rate(evora_http_request_duration_seconds_bucket[{RATE}])))",
                    "p99 {{service}} {{method}} {{route}}",
                )
            ],
            unit="s",
        ),
        12,
        8,
    )
    d.add(
        timeseries(
            "In-flight requests",
            [("sum by (service) (evora_http_requests_in_flight)", "{{service}}")],
        ),
        12,
        8,
    )
    d.add(
        timeseries(
            "Targets up",
            [('sum by (job) (up{job=~"evora-.*"})', "{{job}}")],
            description="Scraped replicas per service.",
        ),
        12,
        8,
    )

    return {
        "uid": "evora-overview",
        "title": "Evora",
        "description": "Evora job queue: queues, dispatcher, sweeper, projector, HTTP.",
        "tags": ["evora"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "time": {"from": "now-3h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "version": 1,
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "name": "queue",
                    "label": "Queue",
                    "type": "query",
                    "datasource": DATASOURCE,
                    "query": {
                        "query": "label_values(evora_queue_jobs, queue)",
                        "refId": "queues",
                    },
                    "definition": "label_values(evora_queue_jobs, queue)",
                    "refresh": 2,
                    "multi": True,
                    "includeAll": True,
                    "allValue": ".*",
                    "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                    "sort": 1,
                }
            ]
        },
        "panels": d.panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render())
    print(f"wrote {OUT}")
