"""Connections to PostgreSQL: one place for codecs, timeouts and pool settings.

Work done for an HTTP request has a deadline. The edge sets a budget (`request_budget`);
each use of a pool connection under it (waiting for the connection, then every statement
until it is released) must end within that budget of the moment it began, else it fails
with TimeoutError (which the edge answers 503 with Retry-After) and its statement is
cancelled on the server. The budget is per use, not per request, so a long-poll claim that
waits between its queries, or a coalesced write made for many requests, gets the whole
budget for each query. Outside requests (sweeper, projector, migrations) nothing changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Literal

import asyncpg
import orjson
from asyncpg.pool import PoolAcquireContext

from evora.protocol.fields import json_skeleton, stored_json

# A job never holds a transaction while it runs (rule 4 of docs/architecture.md); these make
# a stuck client fail fast instead of pinning the outbox horizon and vacuum.
STATEMENT_TIMEOUT_MS = 30_000
IDLE_IN_TRANSACTION_TIMEOUT_MS = 60_000
CONNECT_TIMEOUT_S = 10.0


# The binary form of jsonb is a version byte, then the JSON text.
_JSONB_VERSION = b"\x01"


def _encode_jsonb(value: Any) -> bytes:
    return _JSONB_VERSION + orjson.dumps(value)


# Digits and decimal points as 0: a number that may hold more than a double's 15-17
# significant digits, or an integer beyond 64 bits, shows as a run of 16 zeros.
_DIGITS_AND_POINTS_AS_ZERO = bytes.maketrans(b"0123456789.", b"00000000000")
# Such a number outside strings (json_skeleton empties them).
_LONG_NUMBER = re.compile(rb"[0-9][0-9.]{15,}+")


def _decode_jsonb(data: bytes) -> Any:
    """jsonb as Python values, every number as stored. A client's payload or result may hold
    any number jsonb does: an integer beyond 64 bits, a decimal with more significant
    digits than a double keeps (12345678901234567.89), or one beyond a double's range
    (1e400, through evora.submit). orjson would round the first two and refuse the third,
    so text that may hold one is parsed again (`stored_json`): such a number becomes an
    orjson.Fragment of its text, which every encoder here writes back unchanged, while a
    number a float holds exactly (Evora's own figures, doubles written shortest) stays a
    number. Text without a run of 16 digits (almost all) is parsed once."""
    try:
        value = orjson.loads(memoryview(data)[1:])
    except orjson.JSONDecodeError:  # a number beyond a double
        return stored_json(data[1:])
    if b"0" * 16 in data.translate(_DIGITS_AND_POINTS_AS_ZERO) and _LONG_NUMBER.search(
        json_skeleton(data[1:])
    ):
        return stored_json(data[1:])
    return value


def jsonb_elements(values: Iterable[Any]) -> list[Any]:
    """JSON values as the elements of a jsonb[] parameter. asyncpg reads a list inside an
    array parameter as a sub-array, so a JSON array payload or result would turn into
    several elements (misaligning every other unnest column); a pre-encoded fragment is
    always exactly one element."""
    return [orjson.Fragment(orjson.dumps(value)) for value in values]


# What a connection pooler between Evora and PostgreSQL takes away (EVORA_DATABASE_POOLER;
# docs/deploy.md). "none": a direct connection, the settings travel in the startup packet (no
# extra round trip). "session" (PgBouncer's pool_mode = session): a stock PgBouncer refuses
# every startup parameter it does not know, so the settings are SET once per connection
# instead. "transaction": a session is not Evora's for longer than a transaction, so nothing
# is SET (it would leak into other clients' server connections and be lost for this one:
# the operator sets them on the role, docs/deploy.md) and no statement is prepared by name
# (another client's server connection would run it, or lack it).
Pooler = Literal["none", "session", "transaction"]
# Statements each connection keeps prepared (asyncpg's default), where a pooler allows it.
STATEMENT_CACHE_SIZE = 100


def session_settings(
    statement_timeout: int | None, *, read_only: bool = False, generic_plans: bool = False
) -> dict[str, str]:
    """What every Evora session runs with, however it gets there; `read_only` for a read
    replica's sessions, so that a write sent there by mistake fails in every deployment
    (a hot standby refuses it anyway, a promoted one would not); `generic_plans` for a pool
    whose every statement is a one-job (or one-batch) operation on indexed rows (the
    dispatcher's)."""
    settings = {
        "idle_in_transaction_session_timeout": str(IDLE_IN_TRANSACTION_TIMEOUT_MS),
        # No statement of Evora's runs long enough for LLVM compilation (tens of milliseconds
        # per statement, on the builds that have JIT: most distributions' and managed
        # services') to pay for itself, while one estimate too high makes a statement of a
        # few milliseconds pay it on every run (issue 34); asyncpg's query for a
        # statement's types is estimated in the millions and would be compiled on every new
        # connection. docs/deploy.md says more.
        "jit": "off",
    }
    if statement_timeout is not None:
        settings["statement_timeout"] = str(statement_timeout)
    if read_only:
        settings["default_transaction_read_only"] = "on"
    if generic_plans:
        # asyncpg prepares every statement once per connection, but under the default
        # `auto` PostgreSQL plans it again on every run whenever a custom plan looks cheaper
        # than the generic one, which a `LIMIT $n` or an array parameter makes it do every
        # time (and, from PostgreSQL 18, so are the bodies of the SQL functions it calls):
        # planning cost a one-job claim more than executing it. A generic plan is made once,
        # without the parameters' values, so it suits only statements whose best plan does not
        # depend on them: tests/integration/test_generic_plans.py holds every statement of the
        # dispatcher to a few buffers per job on a filled database under it.
        settings["plan_cache_mode"] = "force_generic_plan"
    return settings


async def _set_session(conn: asyncpg.Connection, settings: dict[str, str]) -> None:
    """Behind a session-mode pooler: the startup settings, SET in one round trip (the values
    are Evora's own numbers and words, never input)."""
    await conn.execute("".join(f"SET {name} = '{value}';" for name, value in settings.items()))


def _initializer(later: dict[str, str]) -> Callable[[asyncpg.Connection], Awaitable[None]]:
    """What a new connection runs first: the settings to SET, if any, then the codecs."""

    async def init(conn: asyncpg.Connection) -> None:
        if later:
            await _set_session(conn, later)
        await _init_connection(conn)

    return init


async def _init_connection(conn: asyncpg.Connection) -> None:
    # Binary, because asyncpg decodes a composite value (the job_image row of an event)
    # only when every field type it holds is read in binary.
    await conn.set_type_codec(
        "jsonb",
        encoder=_encode_jsonb,
        decoder=_decode_jsonb,
        schema="pg_catalog",
        format="binary",
    )
    await conn.set_type_codec(
        "json", encoder=orjson.dumps, decoder=orjson.loads, schema="pg_catalog", format="binary"
    )


# How long a rollback may take when a connection returns to the pool, whatever the
# deadline of the work that used it (which may have passed: that is why it rolls back).
RESET_TIMEOUT_S = 5.0

# Seconds each use of a pool connection may take while serving a request; None elsewhere.
_budget: ContextVar[float | None] = ContextVar("evora_db_budget", default=None)
# When the current use of a pool connection must end (event loop time); None if unbounded.
_deadline: ContextVar[float | None] = ContextVar("evora_db_deadline", default=None)


@contextlib.contextmanager
def request_budget(seconds: float) -> Iterator[None]:
    """Bound every use of a pool connection made in this context (and in tasks it starts)."""
    token = _budget.set(seconds)
    try:
        yield
    finally:
        _budget.reset(token)


@contextlib.contextmanager
def one_deadline() -> Iterator[None]:
    """Every use of a pool connection in this context (several tries of one statement, each
    on a connection of its own) ends by one deadline, the request budget's counted from now,
    where each would otherwise get the whole budget. Without a budget, nothing."""
    budget = _budget.get()
    if budget is None:
        yield
        return
    deadline = asyncio.get_running_loop().time() + budget
    outer = _deadline.get()  # a use nested in another ends no later than it
    token = _deadline.set(deadline if outer is None else min(outer, deadline))
    try:
        yield
    finally:
        _deadline.reset(token)


def _bounded(timeout: float | None) -> float | None:
    """A statement's timeout: the one given, else what is left of the deadline (asyncpg
    raises TimeoutError at once when that is not positive)."""
    deadline = _deadline.get()
    if timeout is not None or deadline is None:
        return timeout
    return deadline - asyncio.get_running_loop().time()


class _DeadlineConnection(asyncpg.Connection):  # type: ignore[misc]
    """Statements without an explicit timeout get what is left of the deadline. (The
    methods keep asyncpg's signatures, `timeout` included: hence the noqa.)"""

    async def execute(
        self,
        query: str,
        *args: Any,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Any:
        return await super().execute(query, *args, timeout=_bounded(timeout))

    async def executemany(
        self,
        command: str,
        args: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Any:
        return await super().executemany(command, args, timeout=_bounded(timeout))

    async def fetch(
        self,
        query: str,
        *args: Any,
        timeout: float | None = None,  # noqa: ASYNC109
        **kw: Any,
    ) -> Any:
        return await super().fetch(query, *args, timeout=_bounded(timeout), **kw)

    async def fetchrow(
        self,
        query: str,
        *args: Any,
        timeout: float | None = None,  # noqa: ASYNC109
        **kw: Any,
    ) -> Any:
        return await super().fetchrow(query, *args, timeout=_bounded(timeout), **kw)

    async def fetchval(
        self,
        query: str,
        *args: Any,
        column: int = 0,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Any:
        return await super().fetchval(query, *args, column=column, timeout=_bounded(timeout))

    async def fetchmany(
        self,
        query: str,
        args: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
        **kw: Any,
    ) -> Any:
        return await super().fetchmany(query, args, timeout=_bounded(timeout), **kw)


class _DeadlineAcquire:
    """`pool.acquire()` under a request budget: the wait for a connection and everything
    done with it share one deadline."""

    def __init__(self, pool: _DeadlinePool, deadline: float, timeout: float | None) -> None:
        self._pool = pool
        self._deadline = deadline
        self._timeout = timeout
        self._inner: PoolAcquireContext | None = None

    async def __aenter__(self) -> Any:
        remaining = self._deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            raise TimeoutError("the request's database deadline passed")
        timeout = remaining if self._timeout is None else min(self._timeout, remaining)
        self._inner = self._pool.acquire_unbounded(timeout=timeout)
        self._token = _deadline.set(self._deadline)
        try:
            return await self._inner.__aenter__()
        except BaseException:
            _deadline.reset(self._token)
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._inner is not None
        try:
            await self._inner.__aexit__(exc_type, exc, traceback)
        finally:
            _deadline.reset(self._token)


class _DeadlinePool(asyncpg.Pool):  # type: ignore[misc]
    def acquire(self, *, timeout: float | None = None) -> Any:
        budget = _budget.get()
        if budget is None:
            return self.acquire_unbounded(timeout=timeout)
        deadline = asyncio.get_running_loop().time() + budget
        outer = _deadline.get()  # a use nested in another ends no later than it
        return _DeadlineAcquire(self, deadline if outer is None else min(outer, deadline), timeout)

    def acquire_unbounded(self, *, timeout: float | None = None) -> PoolAcquireContext:
        return super().acquire(timeout=timeout)


async def _reset(conn: asyncpg.Connection) -> None:
    # Pool connections never LISTEN, lock or SET anything after they connect, so asyncpg's
    # default reset (four statements, an extra round trip per acquire) would be pure overhead
    # on the hot path (and its RESET ALL would undo the settings SET behind a session-mode
    # pooler); only an abandoned transaction needs undoing.
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK", timeout=RESET_TIMEOUT_S)


def _startup(
    pooler: Pooler,
    application_name: str,
    statement_timeout: int | None,
    read_only: bool = False,
    generic_plans: bool = False,
) -> tuple[dict[str, str], dict[str, str], int]:
    """(startup parameters, settings to SET after connecting, asyncpg's statement cache size)
    behind `pooler`. application_name is one of the few parameters PgBouncer passes
    on (it tracks it per client)."""
    settings = session_settings(statement_timeout, read_only=read_only, generic_plans=generic_plans)
    if pooler == "none":
        return {"application_name": application_name, **settings}, {}, STATEMENT_CACHE_SIZE
    if pooler == "session":
        return {"application_name": application_name}, settings, STATEMENT_CACHE_SIZE
    # asyncpg then sends each statement unnamed: Parse, Describe, Bind, Execute and one Sync,
    # which PgBouncer keeps on one server connection (it switches only at a Sync outside a
    # transaction). Its own prepared-statement support needs PgBouncer 1.21 (Debian 12: 1.18).
    # An unnamed statement is planned on every run whatever plan_cache_mode says, so
    # `generic_plans` has nothing to save here (and is not SET, like the rest).
    return {"application_name": application_name}, {}, 0


async def connect(
    dsn: str,
    *,
    application_name: str = "evora",
    statement_timeout: int | None = STATEMENT_TIMEOUT_MS,
    pooler: Pooler = "none",
) -> asyncpg.Connection:
    """A standalone connection (migrations, LISTEN, advisory-lock holders)."""
    startup, later, cache_size = _startup(pooler, application_name, statement_timeout)
    conn: asyncpg.Connection = await asyncpg.connect(
        dsn,
        timeout=CONNECT_TIMEOUT_S,
        server_settings=startup,
        statement_cache_size=cache_size,
    )
    await _initializer(later)(conn)
    return conn


async def create_pool(
    dsn: str,
    *,
    application_name: str = "evora",
    min_size: int = 2,
    max_size: int = 10,
    pooler: Pooler = "none",
    read_only: bool = False,
    generic_plans: bool = False,
) -> asyncpg.Pool:
    """A pool; `generic_plans` plans each statement once per connection (session_settings)."""
    startup, later, cache_size = _startup(
        pooler, application_name, STATEMENT_TIMEOUT_MS, read_only, generic_plans
    )
    # asyncpg.create_pool with our pool and connection classes (it takes no pool class).
    pool = _DeadlinePool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        max_queries=50_000,
        max_inactive_connection_lifetime=300.0,
        init=_initializer(later),
        reset=_reset,
        loop=None,
        connection_class=_DeadlineConnection,
        record_class=asyncpg.Record,
        timeout=CONNECT_TIMEOUT_S,
        server_settings=startup,
        statement_cache_size=cache_size,
    )
    await pool
    return pool
