"""Submitting jobs inside the application's own transaction (docs/sql-enqueue.md).

For applications that keep their data in Evora's PostgreSQL database: `submit` and
`submit_batch` call the SQL functions `evora.submit` and `evora.submit_batch` on a
connection the application already holds, so the job exists exactly when the application's
transaction commits. They take an asyncpg connection (or pool), a psycopg 3 connection or
cursor, or a SQLAlchemy connection or session; `submit_sync` and `submit_batch_sync` take
the synchronous psycopg and SQLAlchemy ones.

No driver is imported here: the connection's own methods are called, so a worker's plain
`pip install evora-queue` needs none of them. Errors are the driver's own: SQLSTATE class 22 or
23 with a message that starts with the field (`priority: must be an integer`); an
idempotency conflict is 23505 with constraint `evora_idempotency_conflict`, a key whose
job was removed 23505 with `evora_idempotent_job_gone`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, TypedDict, Unpack
from uuid import UUID

import orjson

__all__ = ["SubmitOptions", "submit", "submit_batch", "submit_batch_sync", "submit_sync"]

Driver = Literal["asyncpg", "psycopg", "sqlalchemy"]
_DRIVERS: tuple[Driver, ...] = ("asyncpg", "psycopg", "sqlalchemy")

# Parameters go in as text and are cast in SQL, so the application's own type codecs (an
# asyncpg jsonb codec, a SQLAlchemy JSON type) never see them.
_SUBMIT = (
    "SELECT evora.submit({0}, {1}, CAST(CAST({2} AS text) AS jsonb), "
    "CAST(CAST({3} AS text) AS jsonb))"
)
_SUBMIT_BATCH = "SELECT evora.submit_batch(CAST(CAST({0} AS text) AS jsonb))"
_PLACEHOLDERS: dict[Driver, tuple[str, ...]] = {
    "asyncpg": ("$1", "$2", "$3", "$4"),
    "psycopg": ("%s", "%s", "%s", "%s"),
    "sqlalchemy": (":p1", ":p2", ":p3", ":p4"),
}
_EMPTY_PAYLOAD: Any = {}


def _driver(conn: object) -> tuple[Driver, bool]:
    """Which driver `conn` belongs to, and whether its calls are awaited."""
    for cls in type(conn).__mro__:
        root = cls.__module__.partition(".")[0]
        if root in _DRIVERS:
            driver: Driver = root
            if driver == "asyncpg":
                return driver, True
            if driver == "psycopg":
                return driver, any(c.__name__.startswith("Async") for c in type(conn).__mro__)
            return driver, any(
                c.__module__.startswith("sqlalchemy.ext.asyncio") for c in type(conn).__mro__
            )
    raise TypeError(
        "evora.sql_enqueue needs an asyncpg, psycopg 3 or SQLAlchemy connection, "
        f"not {type(conn)!r}"
    )


def _json(value: Any) -> str:
    # orjson writes aware datetimes as RFC 3339; a naive one has no offset and is refused
    # by evora.submit, as by the api.
    return orjson.dumps(value).decode()


class SubmitOptions(TypedDict, total=False):
    """The optional fields of a submission, as in the body of POST /v1/jobs; one left out
    (or None) takes the api's default."""

    priority: int | None
    run_at: datetime | None
    delay_seconds: float | None
    max_attempts: int | None
    lease_seconds: int | None
    backoff: Mapping[str, float] | None
    expires_at: datetime | None
    idempotency_key: str | None
    group_key: str | None
    depends_on: Sequence[UUID | str] | None
    on_dependency_failure: Literal["cancel", "run"] | None


def _options(options: SubmitOptions) -> str:
    unknown = sorted(options.keys() - SubmitOptions.__optional_keys__)
    if unknown:
        raise TypeError(f"unexpected keyword arguments: {', '.join(unknown)}")
    given: dict[str, Any] = {name: v for name, v in options.items() if v is not None}
    if "backoff" in given:
        given["backoff"] = dict(given["backoff"])
    if "depends_on" in given:
        given["depends_on"] = [str(d) for d in given["depends_on"]]
    return _json(given)


class _Call:
    """One call of evora.submit or evora.submit_batch, written for the connection's driver."""

    def __init__(self, conn: object, statement: str, params: Sequence[str], *, awaited: bool):
        self.conn: Any = conn
        self.driver, is_async = _driver(conn)
        if is_async != awaited:
            use = "evora.sql_enqueue.submit" if is_async else "evora.sql_enqueue.submit_sync"
            raise TypeError(
                f"{type(conn).__name__} is {'' if is_async else 'not '}async: use {use}"
            )
        self.sql = statement.format(*_PLACEHOLDERS[self.driver])
        self.params = params

    async def run(self) -> Any:
        if self.driver == "asyncpg":
            return await self.conn.fetchval(self.sql, *self.params)
        if self.driver == "psycopg":
            cursor = await self.conn.execute(self.sql, self.params)
            row = await cursor.fetchone()
            return row[0]
        result = await self.conn.execute(self._text(), self._named())
        return result.scalar_one()

    def run_sync(self) -> Any:
        if self.driver == "psycopg":
            return self.conn.execute(self.sql, self.params).fetchone()[0]
        return self.conn.execute(self._text(), self._named()).scalar_one()

    def _text(self) -> Any:
        from sqlalchemy import text  # only ever reached with a SQLAlchemy connection

        return text(self.sql)

    def _named(self) -> dict[str, str]:
        return {f"p{n}": value for n, value in enumerate(self.params, start=1)}


def _submit_call(
    conn: object, queue: str, type: str, payload: Any, options: SubmitOptions, *, awaited: bool
) -> _Call:
    params = (queue, type, _json(payload), _options(options))
    return _Call(conn, _SUBMIT, params, awaited=awaited)


def _ids(value: Sequence[Any]) -> list[UUID]:
    return [UUID(str(v)) for v in value]


async def submit(
    conn: object,
    queue: str,
    type: str,
    payload: Any = _EMPTY_PAYLOAD,
    **options: Unpack[SubmitOptions],
) -> UUID:
    """Submit one job in the transaction `conn` is in; its id. Fields left out take the
    api's defaults; with an idempotency key used before for the same fields, the id of the
    job first submitted with it."""
    call = _submit_call(conn, queue, type, payload, options, awaited=True)
    return UUID(str(await call.run()))


def submit_sync(
    conn: object,
    queue: str,
    type: str,
    payload: Any = _EMPTY_PAYLOAD,
    **options: Unpack[SubmitOptions],
) -> UUID:
    """`submit` on a synchronous psycopg or SQLAlchemy connection."""
    call = _submit_call(conn, queue, type, payload, options, awaited=False)
    return UUID(str(call.run_sync()))


async def submit_batch(conn: object, jobs: Sequence[Mapping[str, Any]]) -> list[UUID]:
    """Submit jobs, each a mapping shaped like the body of POST /v1/jobs, all or nothing in
    the transaction `conn` is in; their ids, in order. An item may carry a `ref` that later
    items name in their `depends_on` as "ref:<name>"."""
    call = _Call(conn, _SUBMIT_BATCH, (_json(list(jobs)),), awaited=True)
    return _ids(await call.run())


def submit_batch_sync(conn: object, jobs: Sequence[Mapping[str, Any]]) -> list[UUID]:
    """`submit_batch` on a synchronous psycopg or SQLAlchemy connection."""
    call = _Call(conn, _SUBMIT_BATCH, (_json(list(jobs)),), awaited=False)
    return _ids(call.run_sync())
