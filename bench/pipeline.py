"""Pipeline benchmark: `evora pipeline run` (Spark, local mode) against the same aggregates in
plain SQL inside PostgreSQL, and the throughput of `evora pipeline archive`.

    python -m bench.pipeline                 # 1,000,000 events
    python -m bench.pipeline --events 100000 --rounds 1
    python -m bench.pipeline --master spark://127.0.0.1:7077 \
        --conf spark.executor.memory=1g --conf spark.cores.max=2   # on a Spark cluster
    python -m bench.pipeline --master 'local[2]' --master standalone \
        --conf spark.executor.memory=1g --conf spark.cores.max=2   # both, on one load

Starts its own PostgreSQL (embedded wheel, non-durable: the bulk load is not what is
measured) in a temp dir and fills `job_events` with COPY (into its table of events written
one by one, `job_event_rows`): a synthetic week of jobs over 8 queues and 21 queue/type pairs
(retries with backoff, lease expiries, releases, non-retryable failures, dead letters,
operator retries and cancels, 10 weighted error reasons). Every `evora pipeline ...` command
runs as a fresh process, so its wall time includes the JVM start, as an operator would see
it. Each --master runs the same steps in turn on the same loaded events (the archive
watermark is reset between them, each gets its own archive directory); `standalone` starts a
master and --workers workers here (bench/spark_standalone.py). The peak resident set (VmHWM)
of every JVM this benchmark starts is sampled each second and reported per step. With --mongo
the run also writes MongoDB (secantusd-py, a CPU-bound Python server far slower than
MongoDB: indicative only).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from bench import procstats
from bench.spark_standalone import StandaloneCluster
from evora.embedded import LocalMongo, LocalPostgres
from evora.storage.migrate import apply_migrations

QUEUE_TYPES = {
    "emails": ["email.send", "email.bounce", "email.digest"],
    "billing": ["billing.charge", "billing.export", "billing.refund"],
    "reports": ["report.daily", "report.adhoc"],
    "media": ["media.thumb", "media.transcode", "media.probe"],
    "search": ["search.index", "search.reindex"],
    "webhooks": ["webhook.deliver", "webhook.retry"],
    "ml": ["ml.score", "ml.train"],
    "misc": ["misc.cleanup", "misc.ping", "misc.sync"],
}
PAIRS = [(q, t) for q, types in QUEUE_TYPES.items() for t in types]
ERRORS = [
    (("TimeoutError", "upstream timed out after 30s"), 30),
    (("ConnectionError", "connection reset by peer"), 20),
    (("HTTPError", "502 Bad Gateway"), 15),
    (("HTTPError", "503 Service Unavailable"), 10),
    (("ValueError", "invalid payload: missing field 'id'"), 8),
    (("KeyError", "'customer'"), 6),
    (("RateLimited", "429 Too Many Requests"), 5),
    (("IOError", "disk full"), 3),
    (("MemoryError", "worker ran out of memory"), 2),
    (("RuntimeError", "unexpected state"), 1),
]
COLUMNS = (
    "job_id",
    "job_version",
    "queue",
    "type",
    "event",
    "from_state",
    "to_state",
    "attempt",
    "worker_id",
    "at",
    "data",
    "job",
)
# The fields of the job_image row (migration 0007), in order: COPY writes the row binary.
IMAGE_FIELDS = """
SELECT attname FROM pg_attribute
WHERE attrelid = 'evora.job_image'::regclass AND attnum > 0 AND NOT attisdropped
ORDER BY attnum
"""
COPY_CHUNK = 100_000


# -- the synthetic history ---------------------------------------------------------------


class JobHistory:
    """Events of one job, in order, with the job image each carries."""

    def __init__(self, rng: random.Random, at: datetime, queue: str, job_type: str) -> None:
        self.rng = rng
        self.id = uuid.UUID(int=rng.getrandbits(128), version=4)
        self.queue, self.type = queue, job_type
        self.version = 0
        self.attempt = 0
        self.image: dict[str, Any] = {
            "id": self.id,
            "queue": queue,
            "type": job_type,
            "priority": 0,
            "group_key": None,
            "idempotency_key": None,
            "max_attempts": 3,
            "lease_seconds": 30,
            "expires_at": None,
            "cancel_requested": False,
            "last_error": None,
            "created_at": at,
            "run_at": at,
            "started_at": None,
            "finished_at": None,
        }
        self.rows: list[tuple[Any, ...]] = []

    def emit(
        self,
        event: str,
        from_state: str | None,
        to_state: str,
        at: datetime,
        worker: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        self.version += 1
        image = self.image
        image.update(
            state=to_state,
            attempt=self.attempt,
            worker_id=worker,
            version=self.version,
            updated_at=at,
            lease_expires_at=at + timedelta(seconds=30) if to_state == "RUNNING" else None,
        )
        if to_state in ("COMPLETED", "DLQ", "CANCELLED"):
            image["finished_at"] = at
        self.rows.append(
            (
                self.id,
                self.version,
                self.queue,
                self.type,
                event,
                from_state,
                to_state,
                self.attempt,
                worker,
                at,
                orjson.dumps(data or {}).decode(),
                dict(image),
            )
        )


def _image_value(value: Any) -> Any:
    # jsonb fields of the row (last_error) go as text: this connection has no JSON codec.
    return orjson.dumps(value).decode() if isinstance(value, dict) else value


def simulate(rng: random.Random, submitted: datetime, queue: str, job_type: str) -> JobHistory:
    job = JobHistory(rng, submitted, queue, job_type)
    job.emit("submitted", None, "PENDING", submitted)
    now = submitted
    if rng.random() < 0.01:
        job.emit("cancelled", "PENDING", "CANCELLED", now + timedelta(seconds=rng.uniform(1, 60)))
        return job
    budget_resets = 0
    while True:
        now += timedelta(seconds=rng.expovariate(1 / 2.0))
        worker = f"w{rng.randrange(40)}"
        job.attempt += 1
        job.image["started_at"] = now
        job.emit("claimed", "PENDING", "RUNNING", now, worker)
        now += timedelta(seconds=rng.lognormvariate(1.2, 0.9))
        roll = rng.random()
        if roll < 0.80:
            job.emit("completed", "RUNNING", "COMPLETED", now, worker, {"result_bytes": 42})
            return job
        if roll < 0.82:  # released: the attempt does not count
            job.attempt -= 1
            job.emit("released", "RUNNING", "PENDING", now, worker)
            continue
        error_type, message = rng.choices([e for e, _ in ERRORS], [w for _, w in ERRORS])[0]
        error = {"type": error_type, "message": message}
        job.image["last_error"] = error
        fatal = roll > 0.97  # not retryable
        expired = 0.82 <= roll < 0.85
        if not fatal and job.attempt < 3:
            now += timedelta(seconds=2 ** (job.attempt - 1))
            if expired:
                job.emit("lease_expired", "RUNNING", "PENDING", now, worker)
            else:
                job.emit("failed", "RUNNING", "PENDING", now, worker, {"error": error})
            continue
        reason = "not_retryable" if fatal else ("lease_expired" if expired else "failed")
        data = {"reason": reason} if expired else {"error": error, "reason": reason}
        job.emit("dead_lettered", "RUNNING", "DLQ", now, worker, data)
        now += timedelta(minutes=rng.uniform(5, 120))
        if budget_resets == 0 and rng.random() < 0.3:
            budget_resets += 1
            job.attempt = 0
            job.emit("retried", "DLQ", "PENDING", now)
            continue
        if rng.random() < 0.5:
            job.emit("cancelled", "DLQ", "CANCELLED", now, data={"reason": "discarded"})
        return job


def generate(events: int, seed: int) -> Iterator[list[tuple[Any, ...]]]:
    """Chunks of about COPY_CHUNK events, in submission order, a week up to an hour ago."""
    rng = random.Random(seed)
    end = datetime.now(UTC) - timedelta(hours=1)
    start = end - timedelta(days=7)
    jobs_guess = events / 3.3
    step = (end - start) / jobs_guess
    at = start
    made = 0
    chunk: list[tuple[Any, ...]] = []
    while made < events:
        queue, job_type = rng.choice(PAIRS)
        job = simulate(rng, at, queue, job_type)
        rows = job.rows[: events - made]
        chunk.extend(rows)
        made += len(rows)
        at += step * rng.uniform(0.5, 1.5)
        if len(chunk) >= COPY_CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


async def load(dsn: str, events: int, seed: int) -> float:
    conn = await asyncpg.connect(dsn)
    started = time.perf_counter()
    try:
        fields = [row["attname"] for row in await conn.fetch(IMAGE_FIELDS)]
        for chunk in generate(events, seed):
            records = [
                (*row[:-1], tuple(_image_value(row[-1].get(name)) for name in fields))
                for row in chunk
            ]
            # one transaction (one xid) per chunk, as many writers would produce
            # into the table of the events written one by one: `job_events` is a view of it
            # and the batches (migration 0064), which COPY cannot write
            await conn.copy_records_to_table(
                "job_event_rows", schema_name="evora", records=records, columns=COLUMNS
            )
        took = time.perf_counter() - started
        await conn.execute("VACUUM ANALYZE evora.job_event_rows")
        # the projector has consumed it all (the archive needs that)
        await conn.execute(
            "INSERT INTO evora.projector_progress (generation, xid, seq) "
            "SELECT 1, pg_snapshot_xmin(pg_current_snapshot()), evora.last_event_seq()"
        )
    finally:
        await conn.close()
    return took


# -- the same aggregates in SQL ----------------------------------------------------------

_JOBS = """
WITH jobs AS (
    SELECT job_id, max(queue) AS queue, max(type) AS type,
           min(at) FILTER (WHERE event = 'submitted') AS submitted_at,
           min(at) FILTER (WHERE event = 'claimed') AS first_claimed_at,
           max(at) FILTER (WHERE event = 'claimed') AS last_claimed_at,
           min(at) FILTER (WHERE event = 'completed') AS completed_at,
           count(*) FILTER (WHERE event IN ('failed', 'lease_expired')) AS retries,
           bool_or(event = 'dead_lettered') AS dlq
    FROM evora.job_events GROUP BY job_id
)"""


def _throughput(unit: str) -> str:
    """Events that count as throughput per queue (and type) and `unit`."""
    bucket = f"date_trunc('{unit}', at)"
    return f"""
SELECT queue, coalesce(type, '*') AS type, {bucket} AS {unit},
       count(*) FILTER (WHERE event = 'submitted') AS submitted,
       count(*) FILTER (WHERE event = 'claimed') AS claimed,
       count(*) FILTER (WHERE event = 'completed') AS completed,
       count(*) FILTER (WHERE event = 'failed') AS failed,
       count(*) FILTER (WHERE event = 'dead_lettered') AS dead_lettered
FROM evora.job_events
WHERE event IN ('submitted', 'claimed', 'completed', 'failed', 'dead_lettered')
GROUP BY GROUPING SETS ((queue, type, {bucket}), (queue, {bucket}))"""


SQL = {
    "event_totals": """
SELECT queue, coalesce(type, '*') AS type, event, count(*) AS events FROM evora.job_events
GROUP BY GROUPING SETS ((queue, type, event), (queue, event))""",
    "job_states": """
WITH latest AS (
    SELECT DISTINCT ON (job_id) job_id, queue, type, to_state FROM evora.job_events
    ORDER BY job_id, seq DESC
)
SELECT queue, coalesce(type, '*') AS type, to_state, count(*) AS jobs FROM latest
GROUP BY GROUPING SETS ((queue, type, to_state), (queue, to_state))""",
    "per_job": _JOBS
    + """
SELECT queue, coalesce(type, '*') AS type, count(*) AS jobs,
       count(*) FILTER (WHERE retries > 0) AS retried_jobs, sum(retries) AS retries,
       count(*) FILTER (WHERE dlq) AS dead_lettered_jobs,
       percentile_cont(ARRAY[0.5, 0.9, 0.95, 0.99]) WITHIN GROUP (
           ORDER BY extract(epoch FROM first_claimed_at - submitted_at) * 1000) AS wait_ms,
       percentile_cont(ARRAY[0.5, 0.9, 0.95, 0.99]) WITHIN GROUP (
           ORDER BY extract(epoch FROM completed_at - last_claimed_at) * 1000) AS run_ms
FROM jobs GROUP BY GROUPING SETS ((queue, type), (queue))""",
    "throughput_minute": _throughput("minute"),
    "throughput_hour": _throughput("hour"),
    "failure_reasons": """
WITH counted AS (
    SELECT queue, coalesce(type, '*') AS type, error_type, message, count(*) AS failures
    FROM (
        SELECT queue, type, data->'error'->>'type' AS error_type,
               left(coalesce(data->'error'->>'message', ''), 200) AS message
        FROM evora.job_events WHERE data ? 'error'
    ) AS failed
    GROUP BY GROUPING SETS ((queue, type, error_type, message), (queue, error_type, message))
)
SELECT * FROM (
    SELECT *, row_number() OVER (
        PARTITION BY queue, type ORDER BY failures DESC, message, error_type NULLS FIRST) AS rank
    FROM counted
) AS ranked WHERE rank <= 5""",
}


async def sql_aggregates(dsn: str) -> tuple[float, dict[str, int], dict[tuple[str, str], int]]:
    """Seconds for all of SQL, rows per output, and event totals per (queue, event)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SET work_mem = '256MB'")
        started = time.perf_counter()
        rows = {name: await conn.fetch(query) for name, query in SQL.items()}
        took = time.perf_counter() - started
    finally:
        await conn.close()
    totals = {
        (r["queue"], r["event"]): r["events"] for r in rows["event_totals"] if r["type"] == "*"
    }
    return took, {name: len(found) for name, found in rows.items()}, totals


# -- the pipeline, as a fresh process ------------------------------------------------------


def pipeline(job: str, env: dict[str, str], *extra: str) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "evora_services.cli", "pipeline", job, *extra],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.perf_counter() - started
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-5000:])
        raise SystemExit(f"evora pipeline {job} failed ({done.returncode})")
    return took, done.stdout.strip() + "\n" + done.stderr


def job_seconds(log: str, marker: str) -> float | None:
    """The job's own duration as its log reports it (without JVM start and teardown)."""
    for line in log.splitlines():
        if marker in line and "finished in " in line:
            return float(line.split("finished in ")[1].split("s")[0])
    return None


def spark_totals(output: str) -> dict[tuple[str, str], int]:
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        rows = spark.read.parquet(f"{output}/queue_totals").collect()
        return {(r["queue"], e): n for r in rows for e, n in r["by_event"].items()}
    finally:
        spark.stop()


def _cpu_times() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[3] + fields[4], sum(fields)  # idle + iowait, total


PATIENCE = 180.0  # seconds; --patience


def wait_for_quiet(idle: float = 0.85, window: float = 3.0) -> str:
    """Start a timed run only once the machine has been mostly idle for `window` seconds
    (other work shares these cores); gives up after `patience` and says so."""
    if not Path("/proc/stat").exists():
        return "unknown load"
    deadline = time.monotonic() + PATIENCE
    while True:
        idle0, total0 = _cpu_times()
        time.sleep(window)
        idle1, total1 = _cpu_times()
        share = (idle1 - idle0) / max(1, total1 - total0)
        if share >= idle or time.monotonic() > deadline:
            return f"{share:.0%} idle before start"


def timed_runs(rounds: int, env: dict[str, str], *extra: str) -> tuple[list[float], list[float]]:
    """`pipeline run` `rounds` times, each on a quiet machine: the process wall times and
    the job's own times (NaN where its log does not say)."""
    walls, jobs = [], []
    for _ in range(rounds):
        gate = wait_for_quiet()
        took, log = pipeline("run", env, *extra)
        walls.append(took)
        jobs.append(job_seconds(log, "run ") or float("nan"))
        print(f"  run {took:.1f} s ({gate})")
    return walls, jobs


class JvmPeaks:
    """Samples, every `interval` seconds, the peak resident set (VmHWM) of each JVM below this
    process: the drivers of the `pipeline` commands, the executors, the standalone master and
    workers. A JVM's growth in its last interval before it exits is missed."""

    ROLES = (
        ("CoarseGrainedExecutorBackend", "executor"),
        ("deploy.master.Master", "master"),
        ("deploy.worker.Worker", "worker"),
        ("SparkSubmit", "driver"),
    )

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.peaks: dict[int, tuple[str, int]] = {}  # pid -> (role, KiB)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> JvmPeaks:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _role(self, pid: int, own: set[int]) -> str | None:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return None
        # (spark-class first runs launcher.Main, which only prints the command to exec)
        if not cmdline.split("\0", 1)[0].endswith("java") or "launcher.Main" in cmdline:
            return None
        for marker, role in self.ROLES:
            if marker in cmdline:
                # this benchmark's own JVM (spark_totals, a child) is not a measured driver
                return None if role == "driver" and pid in own else role
        return None

    def _sample(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            tree = procstats.children_by_parent()
            own = set(tree.get(me, []))
            pending, below = [me], set()
            while pending:
                for child in tree.get(pending.pop(), []):
                    if child not in below:
                        below.add(child)
                        pending.append(child)
            for pid in below:
                role = self._role(pid, own)
                kib = procstats.status_kib(pid, "VmHWM") if role else None
                if role and kib:
                    with self._lock:
                        self.peaks[pid] = (role, max(kib, self.peaks.get(pid, (role, 0))[1]))
            self._stop.wait(self.interval)

    def take(self) -> str:
        """The peaks sampled since the last take, per role (MiB), and forget them."""
        with self._lock:
            peaks, self.peaks = self.peaks, {}
        by_role: dict[str, list[int]] = {}
        for role, kib in peaks.values():
            by_role.setdefault(role, []).append(kib // 1024)
        return "; ".join(
            f"{role} {', '.join(str(m) for m in sorted(mib))} MiB"
            for role, mib in sorted(by_role.items())
        )


async def reset_archive(dsn: str) -> None:
    """Nothing archived (the state migration 0004 starts from): the next configuration
    archives all the events again, into its own directory."""
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute("DELETE FROM evora.event_archive_runs")
            await conn.execute(
                "UPDATE evora.event_archive_watermark SET upto_seq = 0, below_xid = '0',"
                " archived = 0"
            )
    finally:
        await conn.close()


def median(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} s" + (
        f" (runs: {', '.join(f'{v:.1f}' for v in values)})" if len(values) > 1 else ""
    )


def step_done(peaks: JvmPeaks) -> None:
    print(f"    JVM peak RSS: {peaks.take() or 'none sampled'}; load {procstats.load_average()}")


def main(args: argparse.Namespace) -> None:
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="evora-bench-pipe-")))
        pg = stack.enter_context(LocalPostgres(tmp / "pg", durable=False))
        dsn = pg.dsn()
        asyncio.run(apply_migrations(dsn))
        env = {
            **os.environ,
            "EVORA_DATABASE_URL": dsn,
            "EVORA_LOG_FORMAT": "text",
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        if args.mongo:
            mongo = stack.enter_context(LocalMongo(tmp / "mongo"))
            env["EVORA_MONGO_URL"] = mongo.url
        sink = [] if args.mongo else ["--no-mongo"]
        conf = [arg for item in ["spark.driver.memory=2g", *args.conf] for arg in ("--conf", item)]
        print(f"spark: {' '.join(conf)}")
        print(f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}")
        peaks = stack.enter_context(JvmPeaks())
        masters: list[str | None] = args.master or [None]
        if "standalone" in masters:
            cluster = StandaloneCluster(tmp / "spark", args.workers, args.worker_memory)
            stack.enter_context(cluster)
            print(
                f"standalone: {cluster.master_url}, {args.workers} workers x 1 core, "
                f"{args.worker_memory} each"
            )
            masters = [cluster.master_url if m == "standalone" else m for m in masters]

        print(f"load {procstats.load_average()}")
        copy_seconds = asyncio.run(load(dsn, args.events, args.seed))
        print(f"loaded {args.events:,} events with COPY in {copy_seconds:.1f} s")
        print(f"    load {procstats.load_average()}")

        sql_runs = []
        for _ in range(args.rounds):
            gate = wait_for_quiet()
            took, sql_rows, sql_totals = asyncio.run(sql_aggregates(dsn))
            sql_runs.append(took)
            print(f"  SQL {took:.1f} s ({gate})")
        print(f"plain SQL, 6 queries: {median(sql_runs)}; rows {sql_rows}")
        print(f"    load {procstats.load_average()}")

        for n, master in enumerate(masters):
            if n:
                asyncio.run(reset_archive(dsn))
            archive = tmp / f"archive-{n}"
            env["EVORA_ARCHIVE_URL"] = str(archive)
            spark_conf = [*(["--master", master] if master else []), *conf]
            print(f"== master {master or '(the pipeline default)'}")
            peaks.take()  # the standalone daemons' start-up is in their first step's peak

            live_runs, live_jobs = timed_runs(args.rounds, env, *sink, *spark_conf)
            print(
                f"pipeline run, all {args.events:,} events live over JDBC: "
                f"{median(live_runs)} process wall, {median(live_jobs)} job"
            )
            step_done(peaks)
            totals = spark_totals(str(archive / "analytics"))
            assert totals == sql_totals, "Spark and SQL totals differ"
            print("  queue totals equal the SQL counts")

            gate = wait_for_quiet()
            took, log = pipeline("archive", env, "--older-than", "0", *spark_conf)
            print(f"  archive {took:.1f} s ({gate})")
            archived = int(log.split("archived ")[1].split(" ")[0])
            job = job_seconds(log, "archive run ") or float("nan")
            print(
                f"pipeline archive: {archived:,} events in {took:.1f} s process wall "
                f"= {archived / took:,.0f} events/s; {job:.1f} s job "
                f"= {archived / job:,.0f} events/s"
            )
            step_done(peaks)

            parquet_runs, parquet_jobs = timed_runs(args.rounds, env, *sink, *spark_conf)
            print(
                f"pipeline run, all events from the Parquet archive: {median(parquet_runs)} "
                f"process wall, {median(parquet_jobs)} job"
            )
            step_done(peaks)
            assert spark_totals(str(archive / "analytics")) == sql_totals
            print("  queue totals equal the SQL counts")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3, help="timed repetitions of each run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mongo", action="store_true", help="also write MongoDB")
    parser.add_argument(
        "--master",
        action="append",
        help="Spark master URL of the pipeline runs (default: the pipeline's); repeat it to "
        "run each in turn on the same events; `standalone` starts a cluster here",
    )
    parser.add_argument("--workers", type=int, default=2, help="workers of `standalone`")
    parser.add_argument(
        "--worker-memory", default="1280m", help="memory a `standalone` worker offers"
    )
    parser.add_argument(
        "--conf", action="append", default=[], help="KEY=VALUE Spark setting (repeatable)"
    )
    parser.add_argument(
        "--patience",
        type=float,
        default=PATIENCE,
        help="seconds to wait for an idle machine before each timed run",
    )
    parsed = parser.parse_args()
    PATIENCE = parsed.patience
    main(parsed)
