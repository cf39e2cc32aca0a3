"""What the harness needs from a system under test; `bench.evora_system` and `bench.peers`
supply it."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import asyncpg

from bench.children import Child, Children
from bench.wholelife import Part, vacuum

REPO = Path(__file__).resolve().parents[1]


def source_path(checkout: Path) -> str:
    """A PYTHONPATH running `checkout`'s code, not whatever the environment has installed (an
    editable install of another worktree would mix its `evora` with that checkout's): its
    source roots, in either layout (`evora_services` sat at the top before it moved into
    `services/`)."""
    roots = [checkout / "shared", checkout / "services", checkout]
    return os.pathsep.join(map(str, roots))


class System(ABC):
    """One system in one repetition: its database, its long-running processes (services;
    the worker is started by the harness through the runner) and its runner command."""

    name: str
    # The checkout whose code the system's Python processes run (see `runner_env`).
    source: Path = REPO
    # True while any job is not finished yet (completed jobs are deleted or marked finished).
    # EXISTS, not count(*): the harness polls it while the system works, and a count over
    # the whole table cost PostgreSQL more than a tenth of a core at that rate.
    unfinished_sql: str
    # The schemas of the system's tables (`--whole-life` vacuums them and turns their
    # autovacuum off).
    schemas: tuple[str, ...]

    def __init__(self, children: Children) -> None:
        self.children = children
        self.services: list[Child] = []

    @abstractmethod
    async def start(self, dsn: str, label: str) -> None:
        """Install the schema in the (empty) database `dsn` and start the services."""

    @abstractmethod
    def runner_argv(self) -> list[str]:
        """The runner command (see `bench.runnerkit`) before its mode arguments."""

    def runner_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EVORA_")}
        env["PYTHONPATH"] = source_path(self.source)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def spawn_runner(self, name: str, mode_args: list[str]) -> Child:
        return self.children.spawn(
            f"{self.name}-{name}", self.runner_argv() + mode_args, self.runner_env(), cwd=REPO
        )

    async def run_setup(self, label: str) -> None:
        out = self.children.directory / f"{self.name}-{label}-setup.json"
        await self.spawn_runner(f"{label}-setup", ["setup", "--out", str(out)]).wait_exit(120.0)

    async def counters(self) -> dict[str, float]:
        """The system's own counters (cumulative), for the figures' 'why'."""
        return {}

    async def after_drain(self) -> dict[str, Any]:
        """Anything the system still does once every job is finished (waited for here)."""
        return {}

    async def settle(self, conn: asyncpg.Connection) -> None:
        """Anything the system must still do before it is stopped for the deferred parts
        (`--whole-life`), waited for here. Nothing for a system without services."""
        return

    async def deferred_parts(
        self, conn: asyncpg.Connection, dsn: str, stack: AsyncExitStack
    ) -> list[Part]:
        """The work the finished jobs leave for later (`bench.wholelife`), in the order it
        happens, set up (connections opened, statements found) but not begun; `stack`
        closes what they need once they are done. By default what autovacuum does."""
        return [vacuum(conn, self.schemas)]

    def profile_targets(self) -> list[Child]:
        return []

    def stop(self) -> None:
        for child in reversed(self.services):
            child.stop()
