"""`evora doctor`: an operator's check-up of a deployment, with the services' settings.

Each check gives a verdict (ok, warn, fail) and, unless ok, what to do. The command exits 1
when a check fails, 0 otherwise (warnings included), so that a script or a CI job can gate on
it; `--json` prints the same as one object.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Literal

import asyncpg
import orjson

from evora.config import Settings
from evora.storage import doctor, locks
from evora.storage.db import STATEMENT_TIMEOUT_MS, connect, session_settings
from evora.storage.migrate import (
    missing_versions,
    stale_function_files,
    unfinished_index_builds,
)
from evora_services.cli.startup_errors import explain
from evora_services.dispatcher.wakeups import POLL_SECONDS

Verdict = Literal["ok", "warn", "fail"]

SUPPORTED_MAJORS = range(14, 19)  # docs/deploy.md, "PostgreSQL versions"


@dataclass(frozen=True)
class Thresholds:
    """Where a figure turns into a warning, and into a failure."""

    xmin_warn_seconds: float = 60.0
    xmin_fail_seconds: float = 600.0
    # a table is bloated when its dead row versions are this many and this share of it
    dead_tuples: int = 100_000
    dead_share: float = 0.2
    backlog_events: int = 100_000
    lag_warn_seconds: float = 60.0
    lag_fail_seconds: float = 600.0
    skew_warn_seconds: float = 1.0
    skew_fail_seconds: float = 10.0


@dataclass(frozen=True)
class Finding:
    """What one check found."""

    verdict: Verdict
    detail: str
    action: str | None = None


@dataclass(frozen=True)
class Check(Finding):
    """A finding with the check's name, as reported."""

    name: str = ""


CheckFn = Callable[[asyncpg.Connection, Settings, "Thresholds"], Awaitable[Finding]]


def _graded(value: float, warn: float, fail: float) -> Verdict:
    return "fail" if value >= fail else "warn" if value >= warn else "ok"


async def _version(conn: asyncpg.Connection, _: Settings, __: Thresholds) -> Finding:
    major = await doctor.server_major(conn)
    if major in SUPPORTED_MAJORS:
        return Finding("ok", f"PostgreSQL {major} (supported: 14-18)")
    return Finding(
        "fail",
        f"PostgreSQL {major} is not supported (14-18 are)",
        "upgrade PostgreSQL to a supported major (docs/deploy.md, PostgreSQL versions)",
    )


async def _migrations(conn: asyncpg.Connection, _: Settings, __: Thresholds) -> Finding:
    missing = await missing_versions(conn)
    stale = await stale_function_files(conn)
    if not missing and not stale:
        unfinished = await unfinished_index_builds(conn)
        if unfinished:
            return Finding(
                "warn",
                f"every migration is applied, but {len(unfinished)} index build(s) an upgrade "
                f"leaves to `evora migrate` are not done: {', '.join(unfinished)}",
                "run `evora migrate` again once no transaction has been open for long "
                "(it builds them CONCURRENTLY; docs/deploy.md, Upgrades)",
            )
        return Finding("ok", "every migration and function file this version needs is applied")
    lacking = []
    if missing:
        lacking.append(
            f"{len(missing)} migration(s) not applied: {', '.join(f'{v:04d}' for v in missing)}"
        )
    if stale:
        lacking.append(f"{len(stale)} function file(s) not current: {', '.join(stale)}")
    return Finding("fail", "; ".join(lacking), "run `evora migrate` (docs/deploy.md, Upgrades)")


async def _pooler(conn: asyncpg.Connection, settings: Settings, _: Thresholds) -> Finding:
    mode = settings.database_pooler
    if settings.session_database() is None:
        return Finding(
            "fail",
            f"a transaction-mode pooler and no EVORA_DIRECT_DATABASE_URL: no LISTEN (the "
            f"dispatcher wakes long-polls by polling every {POLL_SECONDS:.0f}s), and the "
            "sweeper, the projector and `evora migrate` refuse to start",
            "set EVORA_DIRECT_DATABASE_URL to PostgreSQL itself (docs/deploy.md, PgBouncer)",
        )
    if mode == "transaction":
        # Behind transaction pooling the services SET nothing: the role must carry them.
        wanted = session_settings(STATEMENT_TIMEOUT_MS)
        if missing := await doctor.settings_differing(conn, wanted):
            return Finding(
                "warn",
                f"behind a transaction-mode pooler Evora's sessions lack {', '.join(missing)}",
                "give Evora's role its settings: "
                + "; ".join(f"ALTER ROLE <role> SET {name} = '{wanted[name]}'" for name in missing)
                + " (docs/deploy.md, PgBouncer)",
            )
    where = "EVORA_DIRECT_DATABASE_URL" if settings.direct_database_url else "EVORA_DATABASE_URL"
    pooled = "no pooler" if mode == "none" else f"a {mode}-mode pooler"
    return Finding(
        "ok",
        f"{pooled} (EVORA_DATABASE_POOLER={mode}); wake-ups by LISTEN and leadership locks "
        f"on {where}",
    )


async def _xmin(conn: asyncpg.Connection, _: Settings, limits: Thresholds) -> Finding:
    holder = await doctor.oldest_xmin_holder(conn)
    if holder is None:
        return Finding("ok", "no transaction holds back xmin")
    detail = (
        f"the oldest transaction holding back xmin is {holder.seconds:.0f}s old (pid "
        f"{holder.pid}, {holder.application}, {holder.state})"
    )
    verdict = _graded(holder.seconds, limits.xmin_warn_seconds, limits.xmin_fail_seconds)
    action = (
        None
        if verdict == "ok"
        else f"end it (SELECT pg_terminate_backend({holder.pid})) and find what left it open: "
        "vacuum, event retention and the archive wait for it (the projector does not)"
    )
    return Finding(verdict, detail, action)


async def _dead(conn: asyncpg.Connection, _: Settings, limits: Thresholds) -> Finding:
    bloated = [
        t
        for t in await doctor.dead_tuples(conn)
        if t.dead >= limits.dead_tuples and t.dead >= limits.dead_share * (t.dead + t.live)
    ]
    if not bloated:
        return Finding("ok", "no table of Evora's is mostly dead row versions")
    return Finding(
        "warn",
        "; ".join(f"{t.table}: {t.dead} dead, {t.live} live row versions" for t in bloated),
        "check that autovacuum keeps up (and that no long transaction stops it), or VACUUM "
        "(ANALYZE) those tables",
    )


async def _backlog(conn: asyncpg.Connection, _: Settings, limits: Thresholds) -> Finding:
    backlog = await doctor.outbox_backlog(conn, limits.backlog_events)
    if backlog.events == 0:
        return Finding("ok", "the projector has consumed every event")
    count = f"{backlog.events}+" if backlog.events >= limits.backlog_events else backlog.events
    oldest = backlog.oldest_seconds or 0.0
    detail = f"{count} event(s) not projected yet, the oldest {oldest:.0f}s old"
    if backlog.progress_seconds is None:
        detail += "; the projector never recorded progress"
    verdict = _graded(oldest, limits.lag_warn_seconds, limits.lag_fail_seconds)
    action = None if verdict == "ok" else "check that a projector runs and leads (its /readyz)"
    return Finding(verdict, detail, action)


def _leader(service: str, key: int) -> CheckFn:
    async def check(conn: asyncpg.Connection, _: Settings, __: Thresholds) -> Finding:
        if await doctor.lock_held(conn, key):
            return Finding("ok", f"a {service} holds the leadership lock")
        return Finding(
            "fail",
            f"no {service} holds the leadership lock",
            f"start `evora {service}` (or see its log for why its lock connection fails)",
        )

    return check


async def _skew(conn: asyncpg.Connection, _: Settings, limits: Thresholds) -> Finding:
    skew = await doctor.clock_skew(conn)
    verdict = _graded(abs(skew), limits.skew_warn_seconds, limits.skew_fail_seconds)
    detail = f"the database's clock is {skew:+.3f}s from this host's"
    action = None if verdict == "ok" else "synchronise the clocks (NTP) of the hosts"
    return Finding(verdict, detail, action)


CHECKS: tuple[tuple[str, CheckFn], ...] = (
    ("postgres_version", _version),
    ("migrations", _migrations),
    ("pooler", _pooler),
    ("long_transactions", _xmin),
    ("dead_tuples", _dead),
    ("projector_lag", _backlog),
    ("sweeper_leader", _leader("sweeper", locks.SWEEPER)),
    ("projector_leader", _leader("projector", locks.PROJECTOR)),
    ("clock_skew", _skew),
)


async def run_checks(settings: Settings, limits: Thresholds = Thresholds()) -> list[Check]:
    """Every check, on one connection made as the services make theirs."""
    assert settings.database_url is not None
    try:
        conn = await connect(
            settings.database_url, application_name="evora-doctor", pooler=settings.database_pooler
        )
    except Exception as exc:
        why = explain(exc, settings) or f"{type(exc).__name__}: {exc}"
        return [Check("fail", why, "fix what it says, then run this again", name="connection")]
    try:
        results = [Check("ok", "connected with the services' settings", name="connection")]
        for name, check in CHECKS:
            try:
                found = await check(conn, settings, limits)
            except asyncpg.PostgresError as exc:  # Evora's tables missing, a privilege...
                found = Finding(
                    "fail", f"cannot check: {exc}", "see the other checks (migrations first)"
                )
            results.append(Check(found.verdict, found.detail, found.action, name=name))
        return results
    finally:
        await conn.close()


def render(results: list[Check]) -> str:
    lines = []
    for result in results:
        lines.append(f"{result.verdict.upper():<4}  {result.name}: {result.detail}")
        if result.action:
            lines.append(f"      what to do: {result.action}")
    return "\n".join(lines)


def main(args: argparse.Namespace, settings: Settings) -> int:
    settings.require("database_url", serving=False)
    results = asyncio.run(run_checks(settings))
    failed = any(result.verdict == "fail" for result in results)
    if args.json:
        checks = [
            {"name": r.name, **asdict(Finding(r.verdict, r.detail, r.action))} for r in results
        ]
        body = {"ok": not failed, "checks": checks}
        sys.stdout.write(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(render(results))
    return 1 if failed else 0
