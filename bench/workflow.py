"""`python -m bench workflow`: a fan-out/fan-in workflow end to end, Evora as deployed (the
services of `bench.evora_system` as processes, the SDK worker of `bench.evora_runner` in its
own process), next to the same number of jobs without dependencies (one repetition of
`bench.workloads`, whose drain is the comparison).

The workflow: one root, `children` jobs that depend on the root, and a join that depends on
all the children. A job may depend on at most MAX_DEPENDENCIES jobs, so with more children
than that the fan-in is a tree: the children in groups of `fan_in`, one join per group, and
a final join that depends on the group joins. Every job is a no-op whose payload `i` says
what it is: 0 the root, 1..children the children, then the group joins, then the final join.

The workflow is submitted with no worker running (root first, then the children in batches,
then the joins in one batch that names the group joins by `ref:`), so that the root's
completion is what releases the children. Then the worker starts and the harness polls
until the final join is COMPLETED. Figures (wall clock of this machine; handler starts are
the worker's, completions are the database's `finished_at`, the moment the completing
transaction started):

- submit: first call made to last call returned, and jobs/s;
- fan-out: the root's completion to the first child's start, and to the last child's;
- fan-in: the last child's completion to the final join's start, and each group join's
  start after the last of its own children completed;
- wall: the root's start to the poll that saw the final join COMPLETED (the drain's measure
  of the comparison: its first start to the poll that saw nothing unfinished).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

from bench.children import Children
from bench.cluster import Cluster
from bench.evora_system import EvoraSystem
from bench.runnerkit import JOB_TYPE, QUEUE
from bench.stats import distribution, median
from bench.workloads import POLL_S, Repetition, Workload
from evora.protocol.bounds import MAX_BATCH, MAX_DEPENDENCIES
from evora.sdk.client import Client, Submission

# The comparison's latency phase is not what this benchmark is about (no figure of it is
# reported): short, for its drain, and so is the worker's idle wait before it.
COMPARISON_RATE = 20.0
COMPARISON_SECONDS = 1.0
COMPARISON_IDLE_S = 0.5


@dataclass(frozen=True)
class Shape:
    children: int = 10_000
    fan_in: int = MAX_DEPENDENCIES
    batch: int = MAX_BATCH
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if not 1 <= self.fan_in <= MAX_DEPENDENCIES:
            raise ValueError(f"fan_in must be 1..{MAX_DEPENDENCIES}")
        if not 1 <= self.batch <= MAX_BATCH:
            raise ValueError(f"batch must be 1..{MAX_BATCH}")
        # the group joins and the final join that names them by ref: one batch
        if self.groups + 1 > MAX_BATCH:
            raise ValueError(f"children / fan_in must be below {MAX_BATCH} group joins")

    @property
    def groups(self) -> int:
        """Group joins under the final join: none when one join can wait for every child."""
        return 0 if self.children <= self.fan_in else math.ceil(self.children / self.fan_in)

    @property
    def jobs(self) -> int:
        return 1 + self.children + self.groups + 1

    @property
    def final(self) -> int:
        """The payload `i` of the final join."""
        return self.jobs - 1

    def group_of(self, child: int) -> int:
        """The payload `i` of the group join that waits for child `child` (1-based)."""
        return self.children + 1 + (child - 1) // self.fan_in


def _item(i: int, depends_on: list[str], ref: str | None = None) -> Submission:
    item = Submission(queue=QUEUE, type=JOB_TYPE, payload={"i": i}, depends_on=depends_on)
    if ref is not None:
        item["ref"] = ref
    return item


async def submit(client: Client, shape: Shape) -> dict[str, Any]:
    """Submits the workflow; when it started and ended, and the final join's id."""
    t_start = time.time()
    root = (await client.submit(QUEUE, JOB_TYPE, {"i": 0})).id
    children: list[str] = []
    for first in range(1, shape.children + 1, shape.batch):
        last = min(first + shape.batch, shape.children + 1)
        batch = [_item(i, [root]) for i in range(first, last)]
        children += [result.id for result in await client.submit_batch(batch)]
    if shape.groups:
        joins = [
            _item(
                shape.children + 1 + g, children[g * shape.fan_in : (g + 1) * shape.fan_in], f"g{g}"
            )
            for g in range(shape.groups)
        ]
        joins.append(_item(shape.final, [f"ref:g{g}" for g in range(shape.groups)]))
    else:
        joins = [_item(shape.final, children)]
    final = (await client.submit_batch(joins))[-1].id
    return {"t_start": t_start, "t_end": time.time(), "final_id": final}


def _epoch(moment: datetime | None) -> float:
    return math.nan if moment is None else moment.timestamp()


class WorkflowRepetition(Repetition):
    """One run of the workflow: `Repetition` with the workflow's phases and figures (and its
    processes, CPU and memory accounting)."""

    def __init__(self, system: EvoraSystem, cluster: Cluster, shape: Shape, label: str) -> None:
        workload = Workload(jobs=shape.jobs, batch=shape.batch, drain_timeout_s=shape.timeout_s)
        super().__init__(system, cluster, workload, label, None)
        self.evora = system
        self.shape = shape
        self.finished: dict[int, float] = {}  # payload i -> finished_at

    async def _phases(self, conn: asyncpg.Connection) -> None:
        final_id = await self._submit()
        await self._run(conn, final_id)
        rows = await conn.fetch(
            "SELECT (payload->>'i')::int AS i, finished_at FROM evora.jobs WHERE queue = $1", QUEUE
        )
        self.finished = {r["i"]: _epoch(r["finished_at"]) for r in rows}

    async def _submit(self) -> str:
        before = self._cpu()
        async with Client(self.evora.urls["api"], self.evora.tokens["producer"]) as client:
            out = await submit(client, self.shape)
        after = self._cpu()
        seconds = out["t_end"] - out["t_start"]
        self.result["submit"] = {
            "jobs": self.shape.jobs,
            "seconds": seconds,
            "jobs_per_s": self.shape.jobs / seconds,
            "cpu_us_per_job": self._per_job_us(before, after, self.shape.jobs),
            "noise_cores": self._noise_cores(before, after),
        }
        final_id: str = out["final_id"]
        return final_id

    async def _run(self, conn: asyncpg.Connection, final_id: str) -> None:
        """Starts the worker; returns once a poll sees the final join COMPLETED."""
        self.worker = self.system.spawn_runner(
            f"{self.label}-worker", ["work", "--out", str(self._out("worker"))]
        )
        await self.worker.wait_ready_line()
        before = self._cpu()
        deadline = time.monotonic() + self.shape.timeout_s
        while True:
            polled = time.time()
            state = await conn.fetchval(
                "SELECT state::text FROM evora.jobs WHERE id = $1", final_id
            )
            if state == "COMPLETED":
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the final join is {state} after {self.shape.timeout_s} s")
            await asyncio.sleep(POLL_S)
        after = self._cpu()
        self.result["run"] = {
            "finished_at": polled,
            "cpu_us_per_job": self._per_job_us(before, after, self.shape.jobs),
            "noise_cores": self._noise_cores(before, after),
        }

    def _score(self, starts: list[list[float]]) -> None:
        shape, done = self.shape, self.finished
        start, duplicates = self._first_starts(starts)
        children = range(1, shape.children + 1)
        child_starts = [start[c] for c in children]
        last_child_done = max(done[c] for c in children)
        groups = range(shape.children + 1, shape.final)
        last_of_group: dict[int, float] = {}
        for c in children:
            g = shape.group_of(c)
            last_of_group[g] = max(last_of_group.get(g, -math.inf), done[c])
        group_delays = [start[g] - last_of_group[g] for g in groups]
        run = self.result["run"]
        run.update(
            {
                "handled": len(start),
                "duplicates": duplicates,
                "root_run_s": done[0] - start[0],
                "fan_out_first_child_s": min(child_starts) - done[0],
                "fan_out_last_child_s": max(child_starts) - done[0],
                "children_per_s": shape.children / (last_child_done - min(child_starts)),
                "fan_in_final_join_s": start[shape.final] - last_child_done,
                "group_join_delay_ms": distribution(group_delays),
                "group_join_min_delay_ms": min(group_delays, default=math.nan) * 1000,
                "wall_s": run["finished_at"] - start[0],
                "wall_db_s": done[shape.final] - start[0],
            }
        )


@dataclass(frozen=True)
class Figure:
    kind: str  # "workflow" or "plain" (the same jobs without dependencies)
    label: str
    unit: str
    read: Callable[[dict[str, Any]], float]


FIGURES = (
    Figure("workflow", "submit", "s", lambda r: r["submit"]["seconds"]),
    Figure("workflow", "submit rate", "jobs/s", lambda r: r["submit"]["jobs_per_s"]),
    Figure(
        "workflow", "root done -> first child start", "ms", lambda r: ms(r, "fan_out_first_child_s")
    ),
    Figure(
        "workflow", "root done -> last child start", "s", lambda r: r["run"]["fan_out_last_child_s"]
    ),
    Figure(
        "workflow",
        "children: first start -> last done",
        "jobs/s",
        lambda r: r["run"]["children_per_s"],
    ),
    Figure(
        "workflow",
        "last child done -> final join start",
        "ms",
        lambda r: ms(r, "fan_in_final_join_s"),
    ),
    Figure(
        "workflow",
        "group join start after its last child, p50",
        "ms",
        lambda r: r["run"]["group_join_delay_ms"]["p50"],
    ),
    Figure(
        "workflow",
        "group join start after its last child, max",
        "ms",
        lambda r: r["run"]["group_join_delay_ms"]["max"],
    ),
    Figure("workflow", "wall: root start -> final join done", "s", lambda r: r["run"]["wall_s"]),
    Figure("plain", "submit", "s", lambda r: r["enqueue"]["seconds"]),
    Figure("plain", "submit rate", "jobs/s", lambda r: r["enqueue"]["jobs_per_s"]),
    Figure("plain", "wall: first start -> all done", "s", lambda r: r["drain"]["seconds"]),
    Figure("plain", "drain rate", "jobs/s", lambda r: r["drain"]["jobs_per_s"]),
)


def ms(run: dict[str, Any], key: str) -> float:
    seconds: float = run["run"][key]
    return seconds * 1000


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each figure's median, min and max over the repetitions of its kind."""
    out = []
    for figure in FIGURES:
        values = [figure.read(r) for r in runs if r["kind"] == figure.kind]
        if values:
            out.append(
                {
                    "kind": figure.kind,
                    "label": figure.label,
                    "unit": figure.unit,
                    "median": median(values),
                    "min": min(values),
                    "max": max(values),
                }
            )
    return out


def lines(shape: Shape, summary: list[dict[str, Any]]) -> list[str]:
    tree = (
        f"{shape.groups} group joins of up to {shape.fan_in:,} children each, under a final join"
        if shape.groups
        else "one join"
    )
    out = [f"1 root -> {shape.children:,} children -> {tree}: {shape.jobs:,} jobs"]
    titles = {"workflow": "the workflow", "plain": "the same jobs without dependencies"}
    for kind, title in titles.items():
        out.append(f"{title} (median [min-max]):")
        for f in (f for f in summary if f["kind"] == kind):
            digits = 0 if f["unit"] == "jobs/s" else 1 if f["unit"] == "ms" else 2
            value = f"{f['median']:,.{digits}f} [{f['min']:,.{digits}f}-{f['max']:,.{digits}f}]"
            out.append(f"  {f['label']:<46} {value} {f['unit']}")
    return out


async def compare(
    cluster: Cluster, directory: Path, shape: Shape, repetitions: int
) -> list[dict[str, Any]]:
    """Repetitions of the plain run and the workflow, interleaved, each on a fresh database."""
    children = Children(directory)
    plain = Workload(
        jobs=shape.jobs,
        batch=shape.batch,
        rate=COMPARISON_RATE,
        seconds=COMPARISON_SECONDS,
        drain_timeout_s=shape.timeout_s,
        idle_s=COMPARISON_IDLE_S,
    )
    runs = []
    try:
        for rep in range(1, repetitions + 1):
            for kind in ("plain", "workflow"):
                label = f"{kind}-r{rep}"
                print(f"== {kind} repetition {rep}/{repetitions}", flush=True)
                database = f"bench_workflow_{kind}_r{rep}"
                dsn = await cluster.fresh_database(database)
                system = EvoraSystem(children, cluster.mongo_url)
                if kind == "plain":
                    result = await Repetition(system, cluster, plain, label, None).run(dsn)
                else:
                    result = await WorkflowRepetition(system, cluster, shape, label).run(dsn)
                result.update(kind=kind, repetition=rep)
                runs.append(result)
                await cluster.execute(f'DROP DATABASE "{database}" WITH (FORCE)')
    finally:
        children.stop_all()
    return runs
