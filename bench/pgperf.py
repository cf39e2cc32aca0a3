"""`perf` profiles of a PostgreSQL cluster during a phase, and where its CPU went in a few lines.

`perf record --call-graph dwarf` samples (cpu-clock: this VM has no hardware counters) the
cluster's processes while the phase runs, or with `system_wide` the whole machine, so that
backends a system opens during the phase are caught too; the summary keeps the samples of
the cluster's own processes (the postmaster's children, listed at the start and at the end
of the phase) and sorts each into one kind of work: the innermost frame of its stack that
names a kind decides (a palloc inside jsonb building is jsonb's, an LWLock inside a WAL
insert is the WAL insert's). The
postgres binary of the embedded wheel keeps its symbol table but has no frame pointers,
hence DWARF unwinding (a copy of each sample's stack; a few MB per second of phase).

Not free: the profiler's own CPU competes for the machine's two cores with the profiled
system, so a phase under `perf` runs slower; its shares are what to read, not its speed.
"""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from pathlib import Path

from bench import procstats

PERF = "perf"
RATE_HZ = 999
STACK_BYTES = 32768

# Kinds of work, each named by the functions that start it. The innermost matching frame of a
# stack decides, so a kind nested in another (a WAL insert inside a heap update inside the
# executor inside PL/pgSQL) is counted as the nested one; "executor" and "PL/pgSQL" keep
# only what no nested kind claimed.
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "WAL flush (commit's fsync, walwriter)",
        ("XLogFlush", "XLogBackgroundFlush", "issue_xlog_fsync", "XLogWrite"),
    ),
    ("WAL insert", ("XLogInsert", "XLogInsertRecord", "XLogRecordAssemble")),
    (
        "index insert",
        ("ExecInsertIndexTuples", "index_insert", "btinsert", "brininsert", "_bt_doinsert"),
    ),
    ("heap update", ("heap_update",)),
    ("heap insert", ("heap_insert", "heap_multi_insert")),
    ("row and heavyweight locks", ("heap_lock_tuple", "LockAcquireExtended", "LockRelease")),
    (
        "NOTIFY",
        (
            "Async_Notify",
            "PreCommit_Notify",
            "AtCommit_Notify",
            "SignalBackends",
            "asyncQueueAddEntries",
            "ProcessIncomingNotify",
            "AsyncExistsPendingNotify",
        ),
    ),
    (
        "jsonb",
        (
            "jsonb_",
            "Jsonb",
            "pushJsonbValue",
            "to_jsonb",
            "datum_to_jsonb",
            "JsonbValueTo",
            "jsonb_build_object",
            "jsonb_agg",
            "convertToJsonb",
            "compareJsonbContainers",
        ),
    ),
    (
        "planning",
        (
            "planner",
            "standard_planner",
            "pg_plan_query",
            "BuildCachedPlan",
            "query_planner",
            "subquery_planner",
        ),
    ),
    (
        "parse and analysis",
        (
            "pg_parse_query",
            "raw_parser",
            "parse_analyze",
            "pg_analyze_and_rewrite",
            "RevalidateCachedQuery",
            "pg_rewrite_query",
        ),
    ),
    (
        "snapshots and visibility",
        (
            "GetSnapshotData",
            "GetTransactionSnapshot",
            "HeapTupleSatisfies",
            "XidInMVCCSnapshot",
            "TransactionIdIsInProgress",
        ),
    ),
    (
        "triggers (queueing and firing)",
        (
            "AfterTriggerSaveEvent",
            "AfterTriggerEndQuery",
            "AfterTriggerFireDeferred",
            "ExecARUpdateTriggers",
            "ExecBRInsertTriggers",
            "ExecARInsertTriggers",
            "ExecBSUpdateTriggers",
            "ExecASUpdateTriggers",
            "ExecCallTriggerFunc",
        ),
    ),
    (
        "executor start and end",
        (
            "ExecutorStart",
            "standard_ExecutorStart",
            "ExecutorEnd",
            "standard_ExecutorEnd",
            "ExecutorFinish",
            "InitPlan",
            "ExecInitNode",
            "ExecEndNode",
            "FreeExecutorState",
        ),
    ),
    ("executor", ("ExecutorRun", "standard_ExecutorRun", "ExecProcNode", "ExecScan")),
    (
        "SQL-language functions (fmgr_sql)",
        ("fmgr_sql", "init_sql_fcache", "sql_exec_", "postquel_"),
    ),
    ("PL/pgSQL", ("plpgsql_", "exec_stmt", "exec_eval_", "exec_assign", "exec_dynquery")),
    (
        "commit and transaction start/end",
        (
            "CommitTransaction",
            "StartTransaction",
            "AbortTransaction",
            "RecordTransactionCommit",
            "AtEOXact_",
            "AtCommit_",
            "ResourceOwnerRelease",
        ),
    ),
    (
        "client protocol (read, write, bind)",
        (
            "pq_",
            "secure_read",
            "secure_write",
            "socket_",
            "internal_flush",
            "exec_bind_message",
            "ReadCommand",
            "WaitEventSetWait",
            "printtup",
            "SendRowDescriptionMessage",
        ),
    ),
)


# Frames whose inclusive share the summary always shows, found or not: the statements'
# functions (SQL-language and PL/pgSQL), the per-statement work of CHECK constraints and
# trigger WHEN clauses (read from the catalog's text and planned at each statement's first
# row), the answer's rows, the commit, and each UUID's random bytes (`pg_strong_random`: on a
# build without OpenSSL, such as the embedded wheel's, an open, read and close of
# /dev/urandom per call).
NOTABLE = (
    "fmgr_sql",
    "plpgsql_exec_function",
    "ExecInsertIndexTuples",
    "heap_update",
    "heap_insert",
    "XLogInsert",
    "ExecConstraints",
    "TriggerEnabled",
    "printtup",
    "CommitTransaction",
    "GetCachedPlan",
    "pg_strong_random",
)


def _kind(stack: list[str]) -> str:
    """`stack`: function names from the leaf outwards."""
    for frame in stack:
        for kind, starts in KINDS:
            if frame.startswith(starts):
                return kind
    return "other"


def process_kinds(postmaster: int) -> dict[int, str]:
    """Each child of the postmaster, by what its command line says it is (`postgres: walwriter`,
    `postgres: postgres db 127.0.0.1(5432) idle`: a backend)."""
    kinds = {postmaster: "postmaster"}
    for pid in procstats.children_of(postmaster):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        words = title.removeprefix("postgres:").split()
        kinds[pid] = (
            " ".join(words[:2])
            if words[:1] in (["autovacuum"], ["background"], ["logical"])
            else words[0]
            if len(words) <= 2 or words[0] in ("checkpointer", "walwriter", "startup")
            else "backend"
        )
    return kinds


class PgPerf:
    """One `perf record -a` at a time; `stop` returns the summary of the cluster's samples."""

    def __init__(self, directory: Path, postmaster: int) -> None:
        self.directory = directory
        self.postmaster = postmaster
        self.running: tuple[subprocess.Popen[bytes], Path, dict[int, str]] | None = None
        directory.mkdir(parents=True, exist_ok=True)

    def start(self, label: str, *, system_wide: bool = False) -> None:
        out = self.directory / f"perf-{label}.data"
        kinds = process_kinds(self.postmaster)
        target = ["-a"] if system_wide else ["-p", ",".join(map(str, sorted(kinds)))]
        popen = subprocess.Popen(
            [
                PERF,
                "record",
                *target,
                "-F",
                str(RATE_HZ),
                "--call-graph",
                f"dwarf,{STACK_BYTES}",
                "-o",
                str(out),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=(self.directory / f"perf-{label}.log").open("wb"),
        )
        self.running = (popen, out, kinds)

    def stop(self) -> list[str]:
        assert self.running is not None
        popen, out, kinds = self.running
        self.running = None
        kinds = {**kinds, **process_kinds(self.postmaster)}
        popen.send_signal(signal.SIGINT)
        try:
            popen.wait(60)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
        return summarize(out, kinds)


def samples(data: Path, pids: set[int]) -> list[tuple[int, list[str]]]:
    """(pid, stack from the leaf outwards) of every sample of `pids` in a perf.data file."""
    script = subprocess.run(
        [
            PERF,
            "script",
            "-i",
            str(data),
            "-F",
            "pid,ip,sym",
            "--no-inline",
            "--pid",
            ",".join(map(str, sorted(pids))),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found: list[tuple[int, list[str]]] = []
    for block in script.split("\n\n"):
        lines = [line.strip() for line in block.strip().splitlines()]
        if not lines or not lines[0].split()[0].isdigit():
            continue
        # "address symbol+offset (dso)" with -F ip,sym: keep the symbol
        stack = [
            line.split(None, 1)[1].split("+0x")[0] if " " in line else "?" for line in lines[1:]
        ]
        found.append((int(lines[0].split()[0]), stack))
    return found


def summarize(data: Path, kinds: dict[int, str], top: int = 15) -> list[str]:
    taken = samples(data, set(kinds))
    if not taken:
        return ["(no samples of the cluster)"]
    total = len(taken)
    by_process: Counter[str] = Counter(kinds[pid] for pid, _ in taken)
    by_kind: Counter[str] = Counter(_kind(stack) for _, stack in taken)
    leaves: Counter[str] = Counter(stack[0] if stack else "?" for _, stack in taken)
    inclusive: Counter[str] = Counter()
    for _, stack in taken:
        inclusive.update(set(stack))
    lines = [f"{total} samples of the cluster at {RATE_HZ} Hz; by process:"]
    lines += [f"  {100 * n / total:5.1f}% {name}" for name, n in by_process.most_common()]
    lines.append("by kind of work (the innermost frame that names one):")
    lines += [f"  {100 * n / total:5.1f}% {name}" for name, n in by_kind.most_common()]
    lines.append("functions on top of the stack (self):")
    lines += [f"  {100 * n / total:5.1f}% {name}" for name, n in leaves.most_common(top)]
    lines.append("notable functions anywhere on the stack (inclusive):")
    lines += [f"  {100 * inclusive[name] / total:5.1f}% {name}" for name in NOTABLE]
    lines.append("functions anywhere on the stack (inclusive):")
    lines += [
        f"  {100 * n / total:5.1f}% {name}"
        for name, n in inclusive.most_common(4 * top)
        if n < 0.97 * total
    ][: 2 * top]
    return lines
