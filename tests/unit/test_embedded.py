"""LocalPostgres against real PostgreSQL binaries: persistence and data-directory guards."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from evora.embedded import EmbeddedServerError, LocalPostgres
from evora.embedded._pgbin import BIN_DIR_ENV, find_bin_dir


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Not tmp_path: pytest keeps its last three runs, and each cluster is ~40 MB.
    with tempfile.TemporaryDirectory(prefix="evora-test-embedded-") as tmp:
        yield Path(tmp) / "data"


async def _fetchval(dsn: str, query: str) -> object:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(query)
    finally:
        await conn.close()


async def test_committed_data_survives_stop_and_start(data_dir: Path) -> None:
    pg = LocalPostgres(data_dir)
    await asyncio.to_thread(pg.start)
    try:
        await _fetchval(pg.dsn(), "CREATE TABLE kept AS SELECT 42 AS answer")
        await asyncio.to_thread(pg.stop)
        assert not pg.running
        await asyncio.to_thread(pg.start)
        assert await _fetchval(pg.dsn(), "SELECT answer FROM kept") == 42
    finally:
        await asyncio.to_thread(pg.stop)


async def test_refuses_a_data_dir_another_server_is_using(data_dir: Path) -> None:
    with LocalPostgres(data_dir, durable=False):
        second = LocalPostgres(data_dir, durable=False)
        with pytest.raises(EmbeddedServerError, match="already running"):
            await asyncio.to_thread(second.start)
        assert not second.running


@pytest.mark.parametrize("owner", ["exited", "unrelated"])
async def test_starts_over_a_stale_pid_file(data_dir: Path, owner: str) -> None:
    pg = LocalPostgres(data_dir, durable=False)
    await asyncio.to_thread(pg.start)
    pid_file = data_dir / "postmaster.pid"
    left_by_crash = pid_file.read_text()
    await asyncio.to_thread(pg.stop)
    # What a killed server leaves behind: its pid file, naming a pid that is now either
    # gone or (after a reboot or container restart) reused by some other program.
    stranger = await asyncio.create_subprocess_exec("sleep", "30")
    if owner == "exited":
        stranger.kill()
        await stranger.wait()
    old_pid = left_by_crash.split("\n", 1)[0]
    pid_file.write_text(left_by_crash.replace(old_pid, str(stranger.pid), 1))
    try:
        await asyncio.to_thread(pg.start)
        assert await _fetchval(pg.dsn(), "SELECT 1") == 1
    finally:
        await asyncio.to_thread(pg.stop)
        if stranger.returncode is None:
            stranger.kill()
            await stranger.wait()


def test_dsn_names_the_database(data_dir: Path) -> None:
    pg = LocalPostgres(data_dir, port=15432)
    assert pg.dsn() == "postgresql://postgres@127.0.0.1:15432/postgres"
    assert pg.dsn("evora dev") == "postgresql://postgres@127.0.0.1:15432/evora%20dev"


def test_evora_pg_bin_dir_chooses_the_server_binaries(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("initdb", "postgres"):
        (tmp_path / name).touch()
    monkeypatch.setenv(BIN_DIR_ENV, str(tmp_path))
    assert find_bin_dir() == tmp_path.resolve()


def test_evora_pg_bin_dir_without_a_server_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # not a silent fall back to the wheel: a test leg of another major would run on 18
    monkeypatch.setenv(BIN_DIR_ENV, str(tmp_path))
    with pytest.raises(EmbeddedServerError, match=BIN_DIR_ENV):
        find_bin_dir()
