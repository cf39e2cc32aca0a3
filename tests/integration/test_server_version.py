"""The tests run on a supported PostgreSQL, and on the one the run asked for.

scripts/test.sh runs the storage tests again on each supported major besides 18 (the wheel's),
naming it in EVORA_TEST_PG_MAJOR, and says which leg must have JIT (Debian's 15, built with
LLVM) in EVORA_TEST_PG_JIT: a leg that quietly ran on another build would pass for a version,
or a JIT-enabled build, that was never tested."""

from __future__ import annotations

import os

import asyncpg

SUPPORTED_MAJORS = range(14, 19)  # docs/deploy.md


async def test_the_server_is_the_supported_postgresql_asked_for(db_url: str) -> None:
    # a plain connection: Evora's own sessions turn JIT off (storage/db.py)
    conn = await asyncpg.connect(db_url)
    try:
        major = int(await conn.fetchval("SHOW server_version_num")) // 10_000
        jit = await conn.fetchval("SELECT pg_jit_available()")
    finally:
        await conn.close()
    assert major in SUPPORTED_MAJORS
    if wanted := os.environ.get("EVORA_TEST_PG_MAJOR"):
        assert major == int(wanted)
    if os.environ.get("EVORA_TEST_PG_JIT") == "1":
        assert jit, "this leg is meant to run on a build with JIT (LLVM), and jit = on"
