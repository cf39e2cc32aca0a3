"""Evora as deployed: `evora migrate`, then `evora api`, `evora dispatcher`, `evora sweeper`
and `evora projector` as separate processes with production defaults. Only the database
and MongoDB URLs, the tokens, the ports and a loopback bind address are set."""

from __future__ import annotations

import asyncio
import secrets
import socket
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from prometheus_client.parser import text_string_to_metric_families

from bench.children import Child, Children
from bench.system import System
from bench.wholelife import Part, evora_parts

SERVICES = ("api", "dispatcher", "sweeper", "projector")
READY_TIMEOUT_S = 60.0
CATCH_UP_TIMEOUT_S = 300.0
# Counters shown with the figures: what the dispatcher and projector did per job.
COUNTERS = {
    "dispatcher": (
        "evora_dispatcher_claims_total",
        "evora_dispatcher_wakeups_total",
        "evora_dispatcher_jobs_claimed_total",
        "evora_dispatcher_acks_total",
        "evora_http_requests_total",
    ),
    "api": ("evora_http_requests_total",),
    # whether the sweeper's incremental audit read events inside a measured phase
    "sweeper": ("evora_audit_events_total",),
    "projector": (
        "evora_projector_events_total",
        "evora_projector_batch_size_count",
        "evora_projector_mongo_writes_total",
    ),
}


# (ORDER BY rather than min()/max(): xid8 has no such aggregates before PostgreSQL 16)
# The newest xid of each table of the outbox through its tail index: ordered through the
# `job_events` view (migration 0064), the batches are unfolded whole, every one of them.
_EVERY_EVENT_CONSUMED = """
SELECT (SELECT p.xid FROM evora.projector_progress p ORDER BY p.xid LIMIT 1)
     > (SELECT n.xid FROM ((SELECT r.xid FROM evora.job_event_rows r ORDER BY r.xid DESC LIMIT 1)
                           UNION ALL
                           (SELECT b.xid FROM evora.event_batches b ORDER BY b.xid DESC LIMIT 1)) n
        ORDER BY n.xid DESC LIMIT 1)
"""


def _evora_command(variant: bool = False) -> list[str]:
    # The console script of the environment running the benchmark: what a deployment runs.
    # A variant's services run as a module from its checkout (their working directory).
    script = Path(sys.executable).with_name("evora")
    if script.exists() and not variant:
        return [str(script)]
    return [sys.executable, "-m", "evora_services.cli"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class EvoraSystem(System):
    name = "evora"
    unfinished_sql = (
        "SELECT EXISTS (SELECT FROM evora.jobs WHERE queue = 'bench' AND state IN"
        " ('PENDING', 'RUNNING'))"
    )
    schemas = ("evora",)

    def __init__(
        self,
        children: Children,
        mongo_url: str,
        variant: tuple[str, Path] | None = None,
        *,
        prefetch: int = 0,
        settings: dict[str, str] | None = None,
    ) -> None:
        """`variant`: (label, checkout) to run another checkout's services, SDK and schema
        under the name `evora@label`, for an A/B of two versions in one run. `prefetch`: the
        SDK worker's, under the name `evora-prefetch` (a tuned worker, not the default).
        `settings`: EVORA_* variables beyond the defaults (the soak's short retention)."""
        super().__init__(children)
        if variant is not None:
            self.name = f"evora@{variant[0]}"
            self.source = variant[1].resolve()
        elif prefetch:
            self.name = "evora-prefetch"
        self.prefetch = prefetch
        self.settings = settings or {}
        self.command = _evora_command(variant is not None)
        self.mongo_url = mongo_url
        # Each token begins with "-", as one in 64 of token_urlsafe's do by chance: every
        # client the harness starts is shown to take such a token. The plain HTTP worker once
        # took its token as a positional argument, which argparse read as an option, and
        # failed one run in 64 ("exited while draining (exit 2)").
        self.tokens = {
            role: "-" + secrets.token_urlsafe(18) for role in ("admin", "producer", "worker")
        }
        self.urls: dict[str, str] = {}

    def _env(self, dsn: str, label: str) -> dict[str, str]:
        env = self.runner_env()
        env.update(
            {
                "EVORA_DATABASE_URL": dsn,
                "EVORA_MONGO_URL": self.mongo_url,
                "EVORA_MONGO_DB": label,
                "EVORA_TOKENS": ",".join(f"{r}:{t}" for r, t in self.tokens.items()),
                "EVORA_HOST": "127.0.0.1",
                **self.settings,
            }
        )
        for service in SERVICES:
            port = _free_port()
            env[f"EVORA_{service.upper()}_PORT"] = str(port)
            self.urls[service] = f"http://127.0.0.1:{port}"
        return env

    async def start(self, dsn: str, label: str) -> None:
        env = self._env(dsn, label)
        migrate = await asyncio.create_subprocess_exec(
            *self.command,
            "migrate",
            env=env,
            cwd=self.source,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if await migrate.wait() != 0:
            raise RuntimeError("evora migrate failed")
        await self._find_jobs_table(dsn)
        self.services = [
            self.children.spawn(f"{self.name}-{label}-{s}", [*self.command, s], env, self.source)
            for s in SERVICES
        ]
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(
                *(self._wait_ready(session, c, self.urls[s]) for s, c in self._by_service())
            )

    async def _find_jobs_table(self, dsn: str) -> None:
        """A variant from before every object moved into schema `evora` (migration 0030,
        2026-11-29) keeps its jobs in `public`: the harness polls that table instead, so the
        A/B reaches back past the move (docs/benchmarks/2026-11-29-idle-comparison.md)."""
        conn = await asyncpg.connect(dsn)
        try:
            moved = await conn.fetchval("SELECT to_regclass('evora.jobs') IS NOT NULL")
        finally:
            await conn.close()
        if not moved:
            self.unfinished_sql = EvoraSystem.unfinished_sql.replace("evora.jobs", "public.jobs")

    def _by_service(self) -> list[tuple[str, Child]]:
        return list(zip(SERVICES, self.services, strict=True))

    @staticmethod
    async def _wait_ready(session: aiohttp.ClientSession, child: Child, url: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if not child.alive():
                raise child.failed("exited while starting")
            try:
                async with session.get(url + "/readyz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
        raise child.failed(f"not ready after {READY_TIMEOUT_S:.0f} s")

    def runner_argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "bench.evora_runner",
            "--api",
            self.urls["api"],
            "--dispatcher",
            self.urls["dispatcher"],
            # One argument each: a token may start with "-", which argparse would take
            # for an option.
            f"--producer-token={self.tokens['producer']}",
            f"--worker-token={self.tokens['worker']}",
            f"--prefetch={self.prefetch}",
        ]

    async def _scrape(self, session: aiohttp.ClientSession, service: str) -> dict[str, float]:
        async with session.get(self.urls[service] + "/metrics") as resp:
            text = await resp.text()
        wanted = COUNTERS[service]
        found: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in wanted:
                    labels = ",".join(
                        f"{k}={v}" for k, v in sorted(sample.labels.items()) if k != "service"
                    )
                    key = f"{service}:{sample.name}{{{labels}}}"
                    found[key] = found.get(key, 0.0) + sample.value
        return found

    async def counters(self) -> dict[str, float]:
        found: dict[str, float] = {}
        async with aiohttp.ClientSession() as session:
            for service in COUNTERS:
                found.update(await self._scrape(session, service))
        return found

    async def after_drain(self) -> dict[str, Any]:
        """Waits until the projector has applied every event: its lag behind the drain."""
        started = time.monotonic()
        async with aiohttp.ClientSession() as session:
            while time.monotonic() - started < CATCH_UP_TIMEOUT_S:
                async with session.get(self.urls["projector"] + "/metrics") as resp:
                    text = await resp.text()
                behind = [
                    s.value
                    for f in text_string_to_metric_families(text)
                    for s in f.samples
                    if s.name == "evora_projector_events_behind"
                ]
                if behind and behind[0] == 0:
                    break
                await asyncio.sleep(0.05)
        return {"projector_catch_up_s": time.monotonic() - started}

    async def settle(self, conn: asyncpg.Connection) -> None:
        """Waits until the projector has recorded that it consumed every event (it records
        its progress after writing the read models, a moment after its lag reads 0): event
        retention drops no partition before that."""
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        while time.monotonic() < deadline:
            if await conn.fetchval(_EVERY_EVENT_CONSUMED):
                return
            await asyncio.sleep(0.05)
        raise RuntimeError("the projector did not record every event consumed")

    async def deferred_parts(
        self, conn: asyncpg.Connection, dsn: str, stack: AsyncExitStack
    ) -> list[Part]:
        """The sweeper's audit and retention and autovacuum's work (`bench.wholelife`). A
        variant's are run by this checkout's sweeper code."""
        return await evora_parts(conn, dsn, stack, self.schemas)

    def profile_targets(self) -> list[Child]:
        return list(self.services)
