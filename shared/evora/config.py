"""Configuration from `EVORA_*` environment variables (or a `.env` file).

Every service loads it at start-up; anything invalid stops the process with one line that
names the variable.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from evora.protocol.bounds import (
    DEFAULT_BODY_BUDGET_BYTES,
    DEFAULT_MAX_PAYLOAD_BYTES,
    items_body_bytes,
)
from evora.storage.db import Pooler
from evora.storage.retention import EVENT_PARTITION_SECONDS, EVENT_PARTITIONS_AHEAD

log = logging.getLogger(__name__)

Role = Literal["admin", "producer", "worker"]
ROLES: tuple[Role, ...] = ("admin", "producer", "worker")
LOOPBACK = "127.0.0.1"

MIN_TOKEN_LENGTH = 16
# RFC 6750's b64token, the only characters a Bearer header may carry; it also lets log
# redaction recognise a whole token after "Bearer " (evora.logs).
_TOKEN_SYNTAX = re.compile(r"[A-Za-z0-9._~+/-]+=*")
# Every token value this repository ships or has shipped in docker-compose.yml, k8s/ and the
# docs (of the earlier ones, those shorter than 16 characters fail the length rule anyway).
# They are public, so they are refused outside `evora dev` unless
# EVORA_ALLOW_EXAMPLE_TOKENS=true (docker-compose and the k8s dev overlay set it).
EXAMPLE_TOKENS = frozenset(
    {
        "example-admin-token",
        "example-producer-token",
        "example-worker-token",
        "change-me-admin-token",
        "change-me-producer-token",
        "change-me-worker-token",
        "dev-producer-token",
        "dev-worker-token",
        "change-me-producer",
        "change-me-worker",
    }
)


class ConfigError(Exception):
    """The configuration is invalid; the message is one human-readable line."""


def _port(default: int) -> int:
    return Field(default=default, ge=1, le=65535)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="EVORA_", env_file=".env", extra="ignore", frozen=True
    )

    database_url: str | None = None
    mongo_url: str | None = None
    mongo_db: str = Field(default="evora", min_length=1, pattern=r"^[^/\\. \"$]{1,63}$")
    # Declared before `tokens`, whose validator reads it; `evora dev` always allows them.
    allow_example_tokens: bool = False
    tokens: str | None = Field(default=None, repr=False)
    auth: Literal["enabled", "disabled"] = "enabled"
    host: str = "0.0.0.0"
    api_port: int = _port(8080)
    dispatcher_port: int = _port(8081)
    sweeper_port: int = _port(8082)
    projector_port: int = _port(8083)
    data_dir: Path = Path(".evora")
    max_payload_bytes: int = Field(default=DEFAULT_MAX_PAYLOAD_BYTES, ge=1, le=64 * 1024 * 1024)
    # The memory request bodies may take in one service process (evora.http.budget): half
    # for their bytes, half for parsing them. Unset: 64 MiB, or twice the largest single
    # body if that is more; never less than that.
    body_budget_bytes: int | None = Field(default=None, ge=1)
    # Connections one service process keeps open at once (evora.http.protocol); one more is
    # answered 503 and closed. ~13 KiB each idle: 8192 is ~100 MiB.
    max_connections: int = Field(default=8192, ge=1, le=1_000_000)
    archive_url: str | None = None
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # One JSON object per line, or readable lines; unset: text in `evora dev`, else json.
    log_format: Literal["json", "text"] | None = None
    db_pool_size: int = Field(default=10, ge=1, le=200)
    # A pooler between the services and EVORA_DATABASE_URL's PostgreSQL (PgBouncer's pool
    # mode), so that the services do without what it takes away (evora.storage.db).
    database_pooler: Pooler = "none"
    # PostgreSQL itself, for what needs a session of its own (session_database).
    direct_database_url: str | None = None
    # A hot standby of EVORA_DATABASE_URL's PostgreSQL that the api's reads of jobs and
    # events may go to (docs/scaling.md#read-replica); unset: every read goes to the primary.
    read_database_url: str | None = None
    # How long a read waits for the replica to replay what its client has seen before it
    # goes to the primary instead.
    read_replica_max_wait_ms: int = Field(default=200, ge=0, le=10_000)
    # A replica further behind the primary than this (seconds) answers no reads at all.
    read_replica_max_lag: float = Field(default=5.0, gt=0, le=3600)
    # Retention (the sweeper): how long finished jobs and idempotency keys are kept, seconds.
    retention_completed_seconds: int = Field(default=86_400, ge=60)
    retention_cancelled_seconds: int = Field(default=86_400, ge=60)
    retention_dlq_seconds: int = Field(default=604_800, ge=60)
    retention_idempotency_seconds: int = Field(default=604_800, ge=60)
    # Events leave job_events by whole partitions (docs/deploy.md, Retention) once every
    # event of one is older than this and consumed by the projector, and, with
    # archive_events on, archived to Parquet (`evora pipeline archive`) first.
    retention_events_seconds: int = Field(default=30 * 86_400, ge=60)
    archive_events: bool = False
    # The width of one partition of job_events, and how many the sweeper (and `evora
    # migrate`) keep made ahead of the clock. Short ones are for tests and soaks.
    event_partition_seconds: int = Field(default=EVENT_PARTITION_SECONDS, ge=60, le=31 * 86_400)
    event_partitions_ahead: int = Field(default=EVENT_PARTITIONS_AHEAD, ge=2, le=1000)
    # The dispatcher warns (log and metric) about PENDING jobs due for longer than this that
    # no worker claimed: most often no running worker handles their type.
    unclaimed_warning_seconds: int = Field(default=300, ge=10)

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_any_case(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator(
        "database_url",
        "direct_database_url",
        "read_database_url",
        "mongo_url",
        "tokens",
        "archive_url",
        mode="before",
    )
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("database_url", "direct_database_url", "read_database_url")
    @classmethod
    def _postgres_dsn(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("postgres://", "postgresql://")):
            raise ValueError("must be a postgresql:// URL")
        return value

    @field_validator("mongo_url")
    @classmethod
    def _mongo_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("mongodb://", "mongodb+srv://")):
            raise ValueError("must be a mongodb:// URL")
        return value

    @field_validator("tokens")
    @classmethod
    def _token_pairs(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None:
            parse_tokens(value)
            if not info.data.get("allow_example_tokens", False):
                refuse_example_tokens(value)
        return value

    @property
    def _least_body_budget(self) -> int:
        """Half the body budget holds bodies, so it must hold the largest one."""
        return 2 * items_body_bytes(self.max_payload_bytes)

    @model_validator(mode="after")
    def _budget_holds_a_body(self) -> Settings:
        least = self._least_body_budget
        if self.body_budget_bytes is not None and self.body_budget_bytes < least:
            raise ValueError(
                f"EVORA_BODY_BUDGET_BYTES ({self.body_budget_bytes}) must be at least twice "
                f"the largest body a request may send ({least} bytes, from "
                "EVORA_MAX_PAYLOAD_BYTES): half of it holds bodies, and that largest one "
                "could never be admitted"
            )
        return self

    @property
    def body_budget(self) -> int:
        """The memory request bodies may take in a service process (evora.http.budget)."""
        return self.body_budget_bytes or max(DEFAULT_BODY_BUDGET_BYTES, self._least_body_budget)

    @property
    def auth_enabled(self) -> bool:
        return self.auth == "enabled"

    @property
    def bind_host(self) -> str:
        """Without authentication nothing may listen beyond this machine."""
        return self.host if self.auth_enabled else LOOPBACK

    @property
    def archive_location(self) -> str:
        return self.archive_url or str(self.data_dir / "archive")

    def session_database(self) -> tuple[str, Pooler] | None:
        """Where a connection that must keep its session goes (LISTEN, the sweeper's and
        projector's advisory locks, migrations), and through which pooler:
        EVORA_DIRECT_DATABASE_URL if set, else EVORA_DATABASE_URL unless a transaction-mode
        pooler is in between, which keeps no session: then None."""
        if self.direct_database_url is not None:
            return self.direct_database_url, "none"
        if self.database_url is None or self.database_pooler == "transaction":
            return None
        return self.database_url, self.database_pooler

    def require_session_database(self, what: str) -> tuple[str, Pooler]:
        """session_database, for `what` cannot do without one."""
        if (session := self.session_database()) is None:
            raise ConfigError(
                f"{what} needs a session of its own, which a transaction-mode pooler "
                "(EVORA_DATABASE_POOLER=transaction) does not keep: set "
                "EVORA_DIRECT_DATABASE_URL to PostgreSQL itself (or a session-mode pool)"
            )
        return session

    def token_roles(self) -> dict[str, Role]:
        return parse_tokens(self.tokens) if self.tokens else {}

    def require(self, *names: str, serving: bool = True) -> None:
        """Fail start-up when a variable this command needs is unset. Tokens are needed only
        by a command that serves requests (`serving`), not by `evora migrate`, say."""
        for name in names:
            if getattr(self, name) is None:
                raise ConfigError(f"EVORA_{name.upper()} is required")
        if serving and self.auth_enabled and not self.tokens:
            raise ConfigError("EVORA_TOKENS is required unless EVORA_AUTH=disabled")


def _entries(text: str) -> list[tuple[int, Role, str]]:
    """(position from 1, role, token) of each non-blank entry. Errors name the position and
    never the entry: a malformed entry may well be a secret (a token without its role)."""
    entries: list[tuple[int, Role, str]] = []
    for position, raw in enumerate(text.split(","), start=1):
        if not raw.strip():
            continue
        role, sep, token = (part.strip() for part in raw.partition(":"))
        entry = f"entry {position}"
        if not sep or not token:
            raise ValueError(f"{entry} is not role:token")
        if role not in ROLES:
            raise ValueError(f"{entry} has an unknown role (roles: {', '.join(ROLES)})")
        if len(token) < MIN_TOKEN_LENGTH:
            raise ValueError(f"{entry} has a token shorter than {MIN_TOKEN_LENGTH} characters")
        if not _TOKEN_SYNTAX.fullmatch(token):
            raise ValueError(
                f"{entry} has a token with characters a Bearer token cannot carry "
                "(allowed: letters, digits, - . _ ~ + / and trailing =)"
            )
        entries.append((position, role, token))
    if not entries:
        raise ValueError("no role:token pairs")
    return entries


def parse_tokens(text: str) -> dict[str, Role]:
    """`role:token,role:token` into token -> role. A role may have several tokens."""
    table: dict[str, Role] = {}
    first_at: dict[str, int] = {}
    for position, role, token in _entries(text):
        if token in table and table[token] != role:
            raise ValueError(
                f"entries {first_at[token]} and {position} give the same token to two roles"
            )
        table[token] = role
        first_at.setdefault(token, position)
    return table


def refuse_example_tokens(text: str) -> None:
    """Tokens published in this repository's examples protect nothing."""
    for position, _, token in _entries(text):
        if token in EXAMPLE_TOKENS:
            raise ValueError(
                f"entry {position} is an example token published with Evora; "
                "use a random one (e.g. `openssl rand -hex 24`)"
            )


# EVORA_* variables read outside `Settings`: by clients (the SDK worker, the operator
# commands, the env file of `evora dev`), by the pipeline, and by this repository's tests
# (which start `evora` processes in their environment). With the settings, every name known.
OTHER_VARIABLES = frozenset(
    {
        "EVORA_API_URL",
        "EVORA_DISPATCHER_URL",
        "EVORA_ADMIN_TOKEN",
        "EVORA_PRODUCER_TOKEN",
        "EVORA_WORKER_TOKEN",
        "EVORA_WORKER_QUEUES",
        "EVORA_WORKER_CONCURRENCY",
        "EVORA_JDBC_JAR",
        "EVORA_TEST_DATABASE_URL",
        "EVORA_TEST_MONGO_URL",
    }
)
# How alike an unknown name and a known one must be (difflib's ratio) to call it a typo.
TYPO_SIMILARITY = 0.8


def known_variables() -> frozenset[str]:
    prefix = str(Settings.model_config.get("env_prefix", "")).upper()
    return OTHER_VARIABLES | {prefix + name.upper() for name in Settings.model_fields}


def check_environment(environ: Mapping[str, str]) -> list[str]:
    """Refuse a misspelt EVORA_* variable (one close to a known name): it would otherwise be
    ignored silently, and a misspelt database URL would run `evora dev` on its embedded one.
    Returns a warning for each other unknown EVORA_* name, which may belong to a newer or
    older release, so it does not stop a service."""
    known = known_variables()
    warnings = []
    for name in sorted(environ):
        if not name.startswith("EVORA_") or name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=TYPO_SIMILARITY)
        if close:
            raise ConfigError(f"{name} is not an Evora variable: did you mean {close[0]}?")
        warnings.append(f"{name} is not an Evora variable; it is ignored")
    return warnings


def load_settings(**overrides: Any) -> Settings:
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "configuration"
        message = first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"EVORA_{field.upper()}: {message}") from None
